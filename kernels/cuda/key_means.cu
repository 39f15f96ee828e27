/* key_means.cu - the CUDA backend's key means (be_ops.key_means: CHESS's summary rows and anchor),
 * computed from the device's page copies in the CPU's floats (kernels/mean_kernels.h). */
#include "kernels/cuda/backend_cuda.cuh"

/* A block a (slot, unit), thread t the elements t, t + KM_THREADS, ... of that unit
 * (kernels/mean_kernels.h: the CPU's floats): the row's unscaled elements and, where rows are
 * scaled, the unit's sum of squares. */
__global__ void __launch_bounds__(KM_THREADS, 1) key_means_kernel(km_src s, km_req q, km_outs out, double *sq)
{
    __shared__ float vals[KM_MAX_D];
    const int64_t slot = blockIdx.x;
    const int u = (int)blockIdx.y;
    km_thread_elems(&s, &q, out, slot, u, (int)threadIdx.x, vals);
    if (!q.unit || km_is_anchor(&q, slot)) return;   /* the whole block */
    __syncthreads();
    if (threadIdx.x == 0) sq[slot * q.units + u] = km_unit_sq(vals, s.head_dim);
}

/* A block a scaled row: its units' sums added in order, then every element scaled. */
__global__ void __launch_bounds__(KM_SCALE_THREADS) key_scale_kernel(km_req q, int D, km_outs out, const double *sq)
{
    __shared__ float inv;
    const int64_t slot = blockIdx.x;
    if (threadIdx.x == 0) inv = km_row_inv(sq + slot * q.units, q.units);
    __syncthreads();
    km_thread_scale(&q, D, out, slot, (int)threadIdx.x, inv);
}

/* On the device, from its copies of the pages (each list kept under its name, as attention's are),
 * into the bound rows: nothing goes up but the pages' new rows and changed descriptors, nothing
 * comes back. 0, or -1 with the failure recorded. */
static int key_means_dev(cuda_impl *ci, const be_key_means *m, const km_req *q, float *const *host_out,
                         const size_t *bytes)
{
    if (ci->batch.n && send_batch(ci)) return -1;
    km_dlist *lists = (km_dlist *)malloc(sizeof(km_dlist) * (size_t)m->n_lists);
    if (!lists) return fail(ci, "out of memory");
    for (int l = 0; l < m->n_lists; l++) {
        const be_page_list *L = &m->lists[l];
        pt_call pl;
        int rc = L->from_table ? pt_clone(&ci->tables, L->table, L->from_table) : PT_OK;   /* a fork's first call */
        if (rc == PT_OK)
            rc = pt_build(&ci->tables, L->table, L->shape, L->pages, L->head_pages[m->n_head_kv], L->head_pages,
                          m->n_head_kv, NULL, &pl);
        if (rc != PT_OK) {
            tables_failed(ci, rc);
            free(lists);
            return -1;
        }
        lists[l] = (km_dlist){ pl.pages, pl.head_pages };
    }
    const int64_t n_slots = km_slots(q), scaled = q->unit ? q->np + q->nc + q->ng : 0;
    const size_t lb = sizeof(km_dlist) * (size_t)m->n_lists, sqb = sizeof(double) * (size_t)(scaled * q->units);
    const km_dlist *d_lists = NULL;
    if (!send_batch(ci) && !stage_reserve(ci, stage_size(lb))) d_lists = (const km_dlist *)stage(ci, lists, lb);
    free(lists);
    if (!d_lists || (sqb && grow_dev(ci, (void **)&ci->km_sq, &ci->cap_km_sq, sqb))) return -1;
    km_outs d_out;
    for (int i = 0; i < 4; i++) d_out.o[i] = bytes[i] ? (float *)am_dev_out(&ci->act, host_out[i], bytes[i]) : NULL;
    const km_src src = { NULL, d_lists, m->n_head_kv, m->head_dim };
    key_means_kernel<<<dim3((unsigned)n_slots, (unsigned)q->units), KM_THREADS, 0, ci->stream>>>(src, *q, d_out,
                                                                                                 ci->km_sq);
    if (ck(ci, cudaGetLastError(), "key means kernel")) return -1;
    if (scaled > 0) {
        key_scale_kernel<<<(unsigned)scaled, KM_SCALE_THREADS, 0, ci->stream>>>(*q, m->head_dim, d_out, ci->km_sq);
        if (ck(ci, cudaGetLastError(), "key scale kernel")) return -1;
    }
    return 0;
}

/* On the device where every output is bound; on the host otherwise, and when the device fails
 * (from the host's pages: CHESS counts the rows as computed either way). */
void cuda_key_means(be_backend *b, const be_key_means *m)
{
    cuda_impl *ci = impl_of(b);
    seg_op(ci, SEG_EAGER);
    const km_req q = km_req_of(m);
    if (km_slots(&q) <= 0) return;
    const int64_t dim = (int64_t)q.units * m->head_dim;
    float *const host_out[4] = { q.np ? m->page_rows + q.p0 * dim : NULL, q.nc ? m->chunk_rows + q.c0 * dim : NULL,
                                 q.ng ? m->grid_rows + q.g0 * dim : NULL, q.n_last ? m->anchor : NULL };
    const size_t bytes[4] = { sizeof(float) * (size_t)(q.np * dim), sizeof(float) * (size_t)(q.nc * dim),
                              sizeof(float) * (size_t)(q.ng * dim), q.n_last ? sizeof(float) * (size_t)dim : 0 };
    int on_dev = !ci->failed && m->head_dim <= KM_MAX_D && m->n_head_kv <= PT_MAX_HEADS && q.units <= 65535;
    for (int i = 0; i < 4 && on_dev; i++)
        if (bytes[i] && !bound(ci, host_out[i], bytes[i])) on_dev = 0;
    if (on_dev && key_means_dev(ci, m, &q, host_out, bytes) == 0) return;
    for (int i = 0; i < 4; i++)
        if (bytes[i] && bound(ci, host_out[i], bytes[i])) am_host_write(&ci->act, host_out[i], bytes[i]);
    ci->cpu->ops->key_means(ci->cpu, m);
}
