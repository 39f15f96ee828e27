/* split_merge.cuh - the merge of split-K attention partials, shared by the CUDA backend's attention
 * (backend_cuda.cu) and the synthetic benchmark's (synthetic.cu). Split s of output row r left its
 * maximum m_s and sum l_s at part_ml[(r0 + s) * 2 ..] and its unnormalised output at part_o[(r0 + s) * D ..];
 * the row is sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M), zero where nothing was visible. */
#ifndef KVCHAT_SPLIT_MERGE_CUH
#define KVCHAT_SPLIT_MERGE_CUH

#include <math.h>
#include <stdint.h>

static __device__ __forceinline__ float split_max(const float *part_ml, int64_t r0, int n_split)
{
    float M = -INFINITY;
    for (int s = 0; s < n_split; s++) M = fmaxf(M, part_ml[(r0 + s) * 2]);
    return M;
}

/* element d of the merged row, M = split_max(...) */
static __device__ __forceinline__ float split_merge(const float *part_o, const float *part_ml, int64_t r0, int n_split,
                                                    int D, int d, float M)
{
    float L = 0, o = 0;
    for (int s = 0; s < n_split; s++) {
        float m = part_ml[(r0 + s) * 2];
        if (m == -INFINITY) continue;
        float f = __expf(m - M);
        L += part_ml[(r0 + s) * 2 + 1] * f;
        o += part_o[(r0 + s) * D + d] * f;
    }
    return L > 0 ? o / L : 0.0f;
}

#endif
