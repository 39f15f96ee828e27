/* page_rows.cu - the CUDA backend's page_rows and page_moves ops: the device fills its copies of
 * the cache's pages itself (kernels/page_fill.h) where it already holds the rows, instead of
 * receiving them from the host at the next attention call (issue 25, stages 2 and 5):
 *   page_rows   a prompt chunk's K/V rows, which the cache has just taken from the bound buffers
 *               they were computed in, from those buffers' twins;
 *   page_moves  an eviction's fresh pages, from the device's copies of the pages the host packed
 *               them from. */
#include "kernels/cuda/backend_cuda.cuh"
#include "kernels/page_fill.h"

#define PF_THREADS 256

/* A block a run of rows (a page's share of the chunk). */
__global__ void __launch_bounds__(PF_THREADS) page_fill_kernel(const pf_job *jobs)
{
    pf_fill(&jobs[blockIdx.x], threadIdx.x, PF_THREADS);
}

/* n jobs of `bytes` in all staged for a launch, after what pc_fill queued on the batch (the rows
 * below the filled ones that a copy lacked: sent now, jobs or not, since the batch reads them from
 * the host's pages when it is sent, dev_upload); frees jobs. The device address, or NULL. */
static const void *stage_jobs(cuda_impl *ci, void *jobs, int n, size_t bytes)
{
    const void *d = NULL;
    if (ci->batch.n) send_batch(ci);   /* failed: the batch dropped */
    if (n && !ci->failed && !stage_reserve(ci, stage_size(bytes))) d = stage(ci, jobs, bytes);
    free(jobs);
    return d;
}

/* After a launch of jobs over `rows` rows (launched: whether it was made; its error checked here):
 * the rows counted, or, when none was made or it failed, every copy sent whole next time (pc_fill
 * counted as written rows that no launch writes). */
static void filled(cuda_impl *ci, int launched, const char *what, uint64_t *count, uint64_t rows)
{
    if (launched && !ck(ci, cudaGetLastError(), what)) {
        *count += rows;
        return;
    }
    pc_forget_rows(&ci->copies);
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
    uint64_t rows = 0;
    for (int i = 0; i < m; i++) rows += (uint64_t)jobs[i].rows;
    const pf_job *d_jobs = (const pf_job *)stage_jobs(ci, jobs, m, sizeof(pf_job) * (size_t)m);
    if (!m) return;
    if (d_jobs) page_fill_kernel<<<(unsigned)m, PF_THREADS, 0, ci->stream>>>(d_jobs);
    filled(ci, d_jobs != NULL, "page fill kernel", &ci->rows_written, rows);
}

/* A block a run of moved rows. */
__global__ void __launch_bounds__(PF_THREADS) page_move_kernel(const pf_move_job *jobs)
{
    pf_move(&jobs[blockIdx.x], threadIdx.x, PF_THREADS);
}

void cuda_page_moves(be_backend *b, const be_page_move *m, int n)
{
    cuda_impl *ci = impl_of(b);
    seg_op(ci, SEG_EAGER);
    if (ci->failed || ci->page_rows_off || n <= 0) return;
    pf_move_job *jobs = (pf_move_job *)malloc(sizeof(pf_move_job) * (size_t)n);
    if (!jobs) return;   /* the fresh pages go up whole at their next use, as without this op */
    int nj = 0;
    for (int i = 0; i < n && !ci->failed;) {
        /* a fresh page's runs: built here only if every run's source copy holds its rows */
        const be_page_move *first = &m[i];
        int end = i, ok = !first->dst.bias && !first->dst.head_step && first->dst.n > 0, base = nj;
        int32_t covered = 0;
        for (; end < n && m[end].dst.k == first->dst.k; end++) {
            const be_page_move *e = &m[end];
            if (!ok) continue;
            const pc_copy *src = e->src.stride == first->dst.stride && e->dst_row == covered && e->n > 0
                                     ? pc_find(&ci->copies, &e->src, e->src_row + e->n)
                                     : NULL;
            if (!src) {
                ok = 0;
                continue;
            }
            const size_t at = (size_t)e->src_row * (size_t)src->stride;
            jobs[nj++] = (pf_move_job){ src->k + at, src->v + at, src->pos + e->src_row, NULL, NULL, NULL, e->n,
                                        src->stride };
            covered += e->n;
        }
        pc_copy *dst = ok && covered == first->dst.n ? pc_fill(&ci->copies, &first->dst, 0, first->dst.n) : NULL;
        if (!dst) {
            nj = base;   /* sent whole at its next use instead */
        } else {
            for (int e = i, q = base; e < end; e++, q++) {
                const size_t at = (size_t)m[e].dst_row * (size_t)dst->stride;
                jobs[q].dk = dst->k + at;
                jobs[q].dv = dst->v + at;
                jobs[q].dpos = dst->pos + m[e].dst_row;
            }
        }
        i = end;
    }
    uint64_t rows = 0;
    for (int i = 0; i < nj; i++) rows += (uint64_t)jobs[i].rows;
    const pf_move_job *d_jobs = (const pf_move_job *)stage_jobs(ci, jobs, nj, sizeof(pf_move_job) * (size_t)nj);
    if (!nj) return;
    if (d_jobs) page_move_kernel<<<(unsigned)nj, PF_THREADS, 0, ci->stream>>>(d_jobs);
    filled(ci, d_jobs != NULL, "page move kernel", &ci->rows_moved, rows);
}
