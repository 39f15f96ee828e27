/* bound_pages.cu - the CUDA backend's page bounds (be_ops.bound_pages: Quest's and SentKV's upper
 * bounds of each page's score, kernels/bound_kernels.h) and each KV head's best pages picked on the
 * device. */
#include "kernels/cuda/backend_cuda.cuh"

/* Each KV head's summary count, passed by value. */
typedef struct bd_counts {
    int64_t n[SL_MAX_HEADS];
} bd_counts;

/* Sixteen threads a summary (kernels/bound_kernels.h); KV head blockIdx.y's bounds to its row of u
 * (stride floats; -inf past its count, which the pick's keys leave out). */
__global__ void __launch_bounds__(BD_THREADS) bound_kernel(const float *q, int group, int64_t dim, const float *sum,
                                                           int64_t cap, bd_counts cnt, int64_t stride, float *u)
{
    const int h = blockIdx.y, lane = threadIdx.x % BD_LANES;
    const int64_t i = bd_entry(blockIdx.x, threadIdx.x), n = cnt.n[h];
    const float *mn = sum + bd_summary_at(h, cap, i, dim), *mx = mn + dim;
    float acc = 0.0f;
    for (int j = 0; j < group; j++) {
        const float *qj = q + bd_query_at(h, group, j, dim);
        float v = i < n ? bd_lane_sum(qj, mn, mx, dim, lane) : 0.0f;
        for (int st = BD_LANES / 2; st > 0; st >>= 1) {   /* bd_tree_step, lanes exchanging by shuffles */
            float o = __shfl_down_sync(0xffffffffu, v, st, BD_LANES);
            if (lane < st) v += o;
        }
        if (lane == 0 && i < n) acc += bd_tail(qj, mn, mx, dim, v);
    }
    if (lane == 0 && i < stride) u[bd_out_at(h, stride, i)] = i < n ? acc : -INFINITY;
}

/* Each head's k best keys (bd_keys) as ascending indices and their count, where the call's best and
 * n_best are bound: a block a head, a thread a key (bd_rank). */
__global__ void __launch_bounds__(BE_PICK_MAX) bd_ids_kernel(const uint64_t *keys, int32_t k, int32_t *best,
                                                             int32_t *n_best)
{
    __shared__ uint64_t kh[BE_PICK_MAX];
    const int h = blockIdx.x, i = threadIdx.x;
    kh[i] = i < k ? keys[(int64_t)h * k + i] : 0;
    __syncthreads();
    const int32_t r = i < k ? bd_rank(kh, k, i) : -1;
    const int n = __syncthreads_count(r >= 0);
    if (r >= 0) best[(int64_t)h * k + r] = lp_key_id(kh[i]);
    if (i == 0) n_best[h] = n;
}

/* The summaries stay on the device between calls (kernels/summary_lists.h); the bounds and each
 * head's best are found there, and the best (or every bound, when asked) come back in one copy,
 * or, where the call's best and n_best are bound, stay there for attention without a wait. */
void cuda_bound_pages(be_backend *b, be_bounds *r)
{
    cuda_impl *ci = impl_of(b);
    seg_op(ci, SEG_JOIN);   /* Quest's choice kept for attention: a decode step's layer, nothing waited for */
    const int H = r->n_head_kv;
    if (r->k > BE_PICK_MAX) r->k = BE_PICK_MAX;
    const int32_t k = r->k;
    const size_t ids_bytes = sizeof(int32_t) * (size_t)(H * (k > 0 ? k : 0)), cnt_bytes = sizeof(int32_t) * (size_t)H;
    const int keep = k > 0 && bound(ci, r->best, ids_bytes) && bound(ci, r->n_best, cnt_bytes);
    for (int h = 0; k > 0 && !keep && h < H; h++) r->n_best[h] = 0;
    if (ci->failed) return;
    const int64_t n_all = r->off[H];
    if (keep && n_all <= 0) {   /* nothing to choose: the counts written on the host, sent when read */
        am_host_write(&ci->act, r->n_best, cnt_bytes);
        for (int h = 0; h < H; h++) r->n_best[h] = 0;
        return;
    }
    if (n_all <= 0 || (k <= 0 && !r->u)) return;
    size_t qbytes = sizeof(float) * (size_t)H * (size_t)r->group * (size_t)r->dim;
    if (ci->batch.n && send_batch(ci)) return;   /* the batch holds this call's entries alone */
    char err[160];
    const sl_list *L = sl_update(&ci->sums, r, err, sizeof err);
    if (!L) {
        if (ci->failed) return;   /* a round of the batch failed on its way (recorded) */
        /* no room on the device for the summaries (or too many heads): they are on the host, and
         * so are the CPU backend's threads (whose best, if kept, go up when attention reads them) */
        ub_clear(&ci->batch, 0);
        host_in(ci, r->q, qbytes);
        if (keep) {
            am_host_write(&ci->act, r->best, ids_bytes);
            am_host_write(&ci->act, r->n_best, cnt_bytes);
        }
        ci->cpu->ops->bound_pages(ci->cpu, r);
        return;
    }
    if (send_batch(ci)) return;
    bd_counts cnt;
    int64_t stride = 1;
    for (int h = 0; h < H; h++) {
        cnt.n[h] = r->off[h + 1] - r->off[h];
        if (cnt.n[h] > stride) stride = cnt.n[h];
    }
    const float *dq = bound(ci, r->q, qbytes) ? (const float *)am_dev_in(&ci->act, r->q, qbytes)
                                              : (const float *)stage(ci, r->q, qbytes);
    int64_t blocks[9];
    int rounds = k > 0 ? pk_plan(stride, k, blocks) : 0;
    size_t u_bytes = sizeof(float) * (size_t)(H * stride);
    size_t keys_bytes = k > 0 ? sizeof(uint64_t) * (size_t)(H * blocks[0] * k) : 0;
    size_t best_bytes = k > 0 ? sizeof(uint64_t) * (size_t)(H * k) : 0;
    size_t back = (keep ? 0 : best_bytes) + (r->u ? u_bytes : 0);
    if (!dq || grow_dev(ci, (void **)&ci->bd_u, &ci->cap_bd_u, u_bytes) ||
        (k > 0 && (grow_dev(ci, (void **)&ci->bd_keys, &ci->cap_bd_keys, 2 * keys_bytes + best_bytes) ||
                   grow_dev(ci, (void **)&ci->pick_max, &ci->cap_pick_max, sizeof(float) * (size_t)(H * blocks[0])))) ||
        grow_host(ci, (void **)&ci->h_bd, &ci->cap_h_bd, back))
        return;
    cudaStream_t s = ci->stream;
    dim3 grid((unsigned)((stride + BD_PER_BLOCK - 1) / BD_PER_BLOCK), (unsigned)H);
    bound_kernel<<<grid, BD_THREADS, 0, s>>>(dq, r->group, r->dim, L->dev, L->cap, cnt, stride, ci->bd_u);
    if (ck(ci, cudaGetLastError(), "bound kernel")) return;
    uint64_t *best = ci->bd_keys + 2 * (keys_bytes / sizeof(uint64_t));
    if (k > 0) {
        if (pick_k_best(ci, ci->bd_u, stride, stride, H, NULL, 0, 1.0f, k, blocks, rounds, ci->bd_keys, ci->pick_max,
                        best, "bound "))
            return;
        if (keep) {   /* ascending indices where the call's arrays are on the device; nothing comes back */
            int32_t *d_ids = (int32_t *)am_dev_out(&ci->act, r->best, ids_bytes);
            int32_t *d_cnt = (int32_t *)am_dev_out(&ci->act, r->n_best, cnt_bytes);
            bd_ids_kernel<<<(unsigned)H, BE_PICK_MAX, 0, s>>>(best, k, d_ids, d_cnt);
            ck(ci, cudaGetLastError(), "bound ids kernel");
            if (!r->u) return;
        } else if (ck(ci, cudaMemcpyAsync(ci->h_bd, best, best_bytes, cudaMemcpyDeviceToHost, s), "bound download")) {
            return;
        }
    }
    const size_t u_at = keep ? 0 : best_bytes;
    if (r->u && ck(ci, cudaMemcpyAsync(ci->h_bd + u_at, ci->bd_u, u_bytes, cudaMemcpyDeviceToHost, s),
                   "bound download"))
        return;
    ci->bytes_down += back;
    if (sync_stream(ci, "bounds")) return;
    for (int h = 0; h < H; h++) {
        if (r->u)
            memcpy(r->u + r->off[h], ci->h_bd + u_at + sizeof(float) * (size_t)(h * stride),
                   sizeof(float) * (size_t)cnt.n[h]);
        if (k <= 0 || keep) continue;
        int32_t *ids = r->best + (int64_t)h * k, n = 0;
        for (int32_t i = 0; i < k; i++) {
            uint64_t key;
            memcpy(&key, ci->h_bd + sizeof key * (size_t)(h * k + i), sizeof key);
            if (key == 0) break;
            ids[n++] = lp_key_id(key);
        }
        for (int32_t i = 1; i < n; i++)   /* ascending: a few hundred at most */
            for (int32_t j = i; j > 0 && ids[j - 1] > ids[j]; j--) {
                int32_t t = ids[j];
                ids[j] = ids[j - 1];
                ids[j - 1] = t;
            }
        r->n_best[h] = n;
    }
}
