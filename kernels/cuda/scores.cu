/* scores.cu - the CUDA backend's scores (be_ops.scores: CHESS's summary rows against its anchor),
 * in the CPU's order of additions (kernels/score_kernels.h). */
#include "kernels/cuda/backend_cuda.cuh"

/* A warp a row, as the CPU's vd_dot_f32 adds (kernels/score_kernels.h): the same floats. */
__global__ void __launch_bounds__(SC_THREADS) scores_kernel(const float *m, int64_t n_rows, int64_t dim, const float *x,
                                                            float *y)
{
    const int64_t r = sc_row(blockIdx.x, threadIdx.x);
    const int lane = threadIdx.x % SC_LANES;
    if (r >= n_rows) return;   /* the whole warp */
    float v = sc_lane_sum(m + r * dim, x, dim, lane);
    for (int k = 0; k < SC_N_STRIDES; k++) v += __shfl_down_sync(0xffffffffu, v, sc_stride(k));
    if (lane == 0) y[r] = v;
}

/* On the device where the matrix and the scores are bound (CHESS's summaries: the span of rows the
 * host rewrote is sent, and the scores stay there until the host reads them); on the host
 * otherwise, and once an op has failed (from the host's copies). */
void cuda_scores(be_backend *b, const float *m, int64_t n_rows, int64_t dim, const float *x, float *y)
{
    cuda_impl *ci = impl_of(b);
    seg_op(ci, SEG_EAGER);
    size_t mb = sizeof(float) * (size_t)(n_rows * dim), yb = sizeof(float) * (size_t)n_rows;
    if (n_rows <= 0) return;
    if (!ci->failed && dim > 0 && am_bound(&ci->act, m, mb) && am_bound(&ci->act, y, yb)) {
        const float *dx = am_bound(&ci->act, x, sizeof(float) * (size_t)dim)
                              ? (const float *)am_dev_in(&ci->act, x, sizeof(float) * (size_t)dim)
                              : (const float *)stage(ci, x, sizeof(float) * (size_t)dim);
        if (!dx) goto host;   /* the staging failed (recorded) */
        const float *dm = (const float *)am_dev_in(&ci->act, m, mb);
        float *dy = (float *)am_dev_out(&ci->act, y, yb);
        unsigned blocks = (unsigned)((n_rows + SC_ROWS_PER_BLOCK - 1) / SC_ROWS_PER_BLOCK);
        scores_kernel<<<blocks, SC_THREADS, 0, ci->stream>>>(dm, n_rows, dim, dx, dy);
        ck(ci, cudaGetLastError(), "scores kernel");
        return;
    }
host:;
    am_range r[2] = { { m, mb }, { x, sizeof(float) * (size_t)dim } };
    am_host_read(&ci->act, r, 2);
    am_host_write(&ci->act, y, yb);
    ci->cpu->ops->scores(ci->cpu, m, n_rows, dim, x, y);
}
