/* page_rows.cu - the CUDA backend's page_rows op: a prompt chunk's K/V rows, which the cache has
 * just taken from the bound buffers they were computed in, written into the device's copies of the
 * pages from those buffers' twins (kernels/page_fill.h), so they are not sent up from the host at
 * the next attention call (issue 25, stage 2). */
#include "kernels/cuda/backend_cuda.cuh"
#include "kernels/page_fill.h"

#define PF_THREADS 256

/* A block a run of rows (a page's share of the chunk). */
__global__ void __launch_bounds__(PF_THREADS) page_fill_kernel(const pf_job *jobs)
{
    pf_fill(&jobs[blockIdx.x], threadIdx.x, PF_THREADS);
}

void cuda_page_rows(be_backend *b, const be_page_rows *r, int n)
{
    cuda_impl *ci = impl_of(b);
    seg_op(ci, SEG_EAGER);
    if (ci->failed || ci->page_rows_off || n <= 0) return;
    pf_job *jobs = (pf_job *)malloc(sizeof(pf_job) * (size_t)n);
    if (!jobs) return;   /* the rows go up at the next call that reads the pages, as without this op */
    int m = 0;
    for (int i = 0; i < n; i++) {
        const be_page_rows *e = &r[i];
        const int32_t dim = e->page.stride;
        if (e->n <= 0 || dim <= 0 || e->page.head_step) continue;
        const size_t span = sizeof(float) * (size_t)((int64_t)(e->n - 1) * e->stride + dim);
        /* rows that are not the device's (an unbound buffer) go up from the host as before */
        if (!bound(ci, e->k, span) || !bound(ci, e->v, span)) continue;
        const float *dk = (const float *)am_dev_in(&ci->act, e->k, span);
        const float *dv = (const float *)am_dev_in(&ci->act, e->v, span);
        pc_copy *c = pc_fill(&ci->copies, &e->page, e->row0, e->n);
        if (!c) {
            if (ci->failed) break;
            continue;   /* no device memory for the copy: the attention call that reads it says so */
        }
        const size_t at = (size_t)e->row0 * (size_t)c->stride;
        jobs[m++] = (pf_job){ dk, dv, c->k + at, c->v + at, c->pos + e->row0, e->stride, c->stride, e->n, dim, e->pos0 };
    }
    const size_t bytes = sizeof(pf_job) * (size_t)m;
    const pf_job *d_jobs = NULL;
    /* the rows below the filled ones that a copy lacked go first (pc_fill queued them) */
    if (m && !ci->failed && !(ci->batch.n && send_batch(ci)) && !stage_reserve(ci, stage_size(bytes)))
        d_jobs = (const pf_job *)stage(ci, jobs, bytes);
    free(jobs);
    if (!m) return;
    if (d_jobs) {
        page_fill_kernel<<<(unsigned)m, PF_THREADS, 0, ci->stream>>>(d_jobs);
        if (!ck(ci, cudaGetLastError(), "page fill kernel")) return;
    }
    /* pc_fill counted rows as written that no launch writes: every copy is sent whole next time */
    pc_forget_rows(&ci->copies);
}
