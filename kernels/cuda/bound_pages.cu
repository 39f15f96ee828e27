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
__device__ __forceinline__ void bound_block(const float *q, int group, int64_t dim, const float *sum, int64_t cap,
                                            const bd_counts &cnt, int64_t stride, float *u)
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

__global__ void __launch_bounds__(BD_THREADS) bound_kernel(const float *q, int group, int64_t dim, const float *sum,
                                                           int64_t cap, bd_counts cnt, int64_t stride, float *u)
{
    bound_block(q, group, dim, sum, cap, cnt, stride, u);
}

/* The bounds and each KV head's k best in one launch, where the call's best stay on the device and
 * a head's summaries fit a block's sort (SG_SORT_MAX): every block bounds its summaries as
 * bound_kernel does; the last of a head's blocks to finish (done[h], a ticket a block, set back to
 * 0 by that block for the next launch) reads the head's bounds, sorts their keys in shared memory
 * larger first (bd_best_key, sg_sort_step) and writes the first k that are not empty as ascending
 * indices, and their count (bd_rank: bd_ids_kernel's). The same set as the pick's (lp_key's order). */
static_assert(BE_PICK_MAX <= BD_THREADS, "bound_best_kernel ranks a key a thread");
__global__ void __launch_bounds__(BD_THREADS) bound_best_kernel(const float *q, int group, int64_t dim,
                                                                const float *sum, int64_t cap, bd_counts cnt,
                                                                int64_t stride, float *u, unsigned *done, int32_t k,
                                                                int32_t *best, int32_t *n_best)
{
    extern __shared__ uint64_t keys[];
    __shared__ unsigned ticket;
    bound_block(q, group, dim, sum, cap, cnt, stride, u);
    __threadfence();   /* this block's bounds visible to the head's last block */
    __syncthreads();
    if (threadIdx.x == 0) ticket = atomicAdd(&done[blockIdx.y], 1u);
    __syncthreads();
    if (ticket != gridDim.x - 1) return;
    __threadfence();   /* the ticket seen before the bounds read */
    const int h = blockIdx.y, tid = threadIdx.x, nt = blockDim.x;
    const int64_t n = cnt.n[h];
    const int32_t size = sg_sort_size(n), kk = k < size ? k : size;
    for (int32_t i = tid; i < size; i += nt)   /* past L1: the other blocks' bounds */
        keys[i] = i < n ? bd_best_key(__ldcg(u + bd_out_at(h, stride, i)), i) : 0;
    __syncthreads();
    for (int32_t w = 2; w <= size; w <<= 1)
        for (int32_t j = w >> 1; j > 0; j >>= 1) {
            for (int32_t i = tid; i < size; i += nt) sg_sort_step(keys, w, j, i);
            __syncthreads();
        }
    const int32_t r = tid < kk ? bd_rank(keys, kk, tid) : -1;
    const int chosen = __syncthreads_count(r >= 0);
    if (r >= 0) best[(int64_t)h * k + r] = lp_key_id(keys[tid]);
    if (tid == 0) {
        n_best[h] = chosen;
        done[h] = 0;
    }
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

/* The exclusive prefix sum of v over the block's threads (sh: blockDim.x int64s of shared memory;
 * every thread calls it); the total to *total. */
__device__ int64_t seg_scan(int64_t v, int64_t *sh, int64_t *total)
{
    const int t = threadIdx.x, nt = blockDim.x;
    sh[t] = v;
    __syncthreads();
    for (int d = 1; d < nt; d <<= 1) {   /* Hillis-Steele, inclusive */
        const int64_t o = t >= d ? sh[t - d] : 0;
        __syncthreads();
        sh[t] += o;
        __syncthreads();
    }
    const int64_t inc = sh[t];
    *total = sh[nt - 1];
    __syncthreads();
    return inc - v;
}

/* Positions [a, b) set in bitmap bm by the threads tid of nt (words shared with other ranges: atomics). */
__device__ void seg_set_range(unsigned long long *bm, int64_t a, int64_t b, int tid, int nt)
{
    if (a >= b) return;
    for (int64_t w = (a >> 6) + tid; w <= (b - 1) >> 6; w += nt) atomicOr(bm + w, (unsigned long long)bm_word_mask(a, b, w));
}

/* SentKV's choice (be_bounds.bits; kernels/segment_kernels.h), a block a KV head: the keys sorted in
 * shared memory, the segments' starts and the ranking's prefix of lengths by block scans, the run
 * of the ranking taken whole by every thread at once, the rest by the first warp, the positions set
 * in the head's bitmap. at: [H][2 * SG_SORT_MAX] scratch (starts by index, then lengths by rank). */
__global__ void __launch_bounds__(SG_THREADS) seg_choose_kernel(const float *u, int64_t stride, bd_counts cnt,
                                                                const int64_t *len_of, int64_t cap, int64_t budget,
                                                                int64_t sinks, int64_t len, uint64_t *bits,
                                                                int64_t words, int64_t *at)
{
    extern __shared__ uint64_t keys[];
    __shared__ int64_t sh[SG_THREADS];
    __shared__ int64_t first_out, shortest;
    const int h = blockIdx.x, tid = threadIdx.x, nt = blockDim.x;
    const int64_t n = cnt.n[h];
    const int32_t size = sg_sort_size(n);
    const int64_t *ln = len_of + (int64_t)h * cap;
    int64_t *start = at + (int64_t)h * 2 * SG_SORT_MAX, *by_rank = start + SG_SORT_MAX;
    unsigned long long *bm = (unsigned long long *)(bits + (int64_t)h * words);
    for (int64_t w = tid; w < words; w += nt) bm[w] = 0;
    for (int32_t i = tid; i < size; i += nt) keys[i] = i < n ? sg_key(u[bd_out_at(h, stride, i)], i) : 0;
    if (tid == 0) {
        first_out = n;
        shortest = INT64_MAX;
    }
    /* the segments' starts in index order, and the shortest */
    int64_t a, b, sum = 0, mn = INT64_MAX, covered;
    sg_chunk(n, tid, nt, &a, &b);
    for (int64_t i = a; i < b; i++) {
        sum += ln[i];
        mn = ln[i] < mn ? ln[i] : mn;
    }
    __syncthreads();
    if (mn < INT64_MAX) atomicMin((long long *)&shortest, (long long)mn);
    int64_t p = seg_scan(sum, sh, &covered);
    for (int64_t i = a; i < b; i++) {
        start[i] = p;
        p += ln[i];
    }
    /* larger keys first */
    for (int32_t k = 2; k <= size; k <<= 1)
        for (int32_t j = k >> 1; j > 0; j >>= 1) {
            for (int32_t i = tid; i < size; i += nt) sg_sort_step(keys, k, j, i);
            __syncthreads();
        }
    const int64_t room = sg_room(budget, sinks, covered, len), least = shortest;
    /* the ranking's prefix of lengths: the run taken whole ends at the first segment past which
     * the walk stops or that does not fit */
    sum = 0;
    for (int64_t j = a; j < b; j++) {
        by_rank[j] = ln[lp_key_id(keys[j])];
        sum += by_rank[j];
    }
    int64_t total;
    p = seg_scan(sum, sh, &total);
    for (int64_t j = a; j < b; j++) {
        if (sg_first_out(p, p + by_rank[j], room, least)) {
            atomicMin((long long *)&first_out, (long long)j);
            break;
        }
        p += by_rank[j];
    }
    __syncthreads();
    const int64_t f = first_out;
    /* the always attended, and the run */
    seg_set_range(bm, 0, sinks < len ? sinks : len, tid, nt);
    seg_set_range(bm, covered, len, tid, nt);
    for (int64_t j = a; j < b && j < f; j++) {
        const int32_t i = lp_key_id(keys[j]);
        seg_set_range(bm, start[i], start[i] + by_rank[j], 0, 1);
    }
    if (tid >= 32 || f >= n) return;
    /* past the run: the rest of the ranking by the first warp, 32 segments a step */
    int64_t used = 0;
    for (int64_t j = tid; j < f; j += 32) used += by_rank[j];
    for (int o = 16; o > 0; o >>= 1) used += __shfl_xor_sync(0xffffffffu, used, o);
    for (int64_t j0 = f + 1; j0 < n && room - used >= least;) {
        const int64_t mine = j0 + tid < n ? by_rank[j0 + tid] : -1;
        const unsigned fits = __ballot_sync(0xffffffffu, sg_fits(mine, room, used));
        if (!fits) {
            j0 += 32;
            continue;
        }
        const int l = __ffs(fits) - 1;
        const int32_t i = lp_key_id(keys[j0 + l]);
        const int64_t sl = by_rank[j0 + l];
        seg_set_range(bm, start[i], start[i] + sl, tid, 32);
        used += sl;
        j0 += l + 1;
    }
}

/* sl_device.copy_rows: where the device's copy of the page holds its first `rows` rows under its
 * generation (a prompt's pages after its prefill, a restored cache's once placed; not a decode
 * step's last page, whose deferred row goes up with the next attention call). NULL: no such copy,
 * or the summaries sent from the host (KVCHAT_CUDA_PAGE_ROWS=0). */
const uint16_t *summary_copy_rows(void *ud, const uint16_t *k, uint64_t gen, int32_t rows, int64_t dim)
{
    cuda_impl *ci = (cuda_impl *)ud;
    if (ci->page_rows_off || dim > INT32_MAX) return NULL;
    be_kv_page pg = {};
    pg.k = k;
    pg.gen = gen;
    pg.n = rows;
    pg.stride = (int32_t)dim;
    const pc_copy *c = pc_find(&ci->copies, &pg, rows);
    return c ? c->k : NULL;
}

/* A block a record (kernels/bound_kernels.h): a fold's first record's block folds it, a thread
 * every BD_FOLD_THREADS-th element; the others' return. */
__global__ void __launch_bounds__(BD_FOLD_THREADS) fold_kernel(const bd_fold *f, int64_t dim, float *sums,
                                                               int64_t *len)
{
    const bd_fold *fj = &f[blockIdx.x];
    if (fj->runs < 1) return;
    for (int64_t i = threadIdx.x; i < dim; i += BD_FOLD_THREADS) bd_fold_elem(fj, dim, i, sums, len);
}

/* The folds sl_update queued for list L run, after the batch with the summaries it sent (sent by
 * the caller). 0, or -1 (recorded). */
static int run_folds(cuda_impl *ci, const sl_list *L)
{
    const int64_t n = ci->sums.n_folds;
    ci->sums.n_folds = 0;
    if (n == 0) return 0;
    const size_t bytes = sizeof(bd_fold) * (size_t)n;
    const bd_fold *d = stage_reserve(ci, stage_size(bytes)) ? NULL : (const bd_fold *)stage(ci, ci->sums.folds, bytes);
    if (!d) return -1;
    fold_kernel<<<(unsigned)n, BD_FOLD_THREADS, 0, ci->stream>>>(d, L->dim, L->dev, L->dev_n);
    return ck(ci, cudaGetLastError(), "summary fold kernel");
}

/* The list named r->table brought up to date (sl_update) on the device: the summaries it sends,
 * then the folds. NULL when it could not be (the batch dropped: part of the list may be queued;
 * folds that did not run: every list forgotten, since each counts its folded entries as there). */
static const sl_list *update_sums(cuda_impl *ci, const be_bounds *r)
{
    char err[160];
    const sl_list *L = sl_update(&ci->sums, r, err, sizeof err);
    if (!L) {
        if (!ci->failed) ub_clear(&ci->batch, 0);
        return NULL;
    }
    if (send_batch(ci)) return NULL;
    if (run_folds(ci, L)) {
        sl_forget(&ci->sums);
        return NULL;
    }
    return L;
}

/* Room for `dyn` bytes of dynamic shared memory in a block of `kernel` (beside `fixed` bytes of
 * static), the kernel's limit raised past the default once as far as needed (*set: as raised so
 * far): 1, or 0 when the device cannot (not sticky: the caller takes another path). */
static int smem_allowed(const void *kernel, size_t dyn, size_t fixed, size_t *set)
{
    if (dyn <= *set) return 1;
    int allowed = 0;
    cudaDeviceGetAttribute(&allowed, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
    if ((size_t)allowed < dyn + fixed ||
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dyn) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    *set = dyn;
    return 1;
}

/* The summaries stay on the device between calls (kernels/summary_lists.h); the bounds and each
 * head's best are found there, and the best (or every bound, when asked) come back in one copy,
 * or, where the call's best and n_best are bound, stay there for attention without a wait. */
void cuda_bound_pages(be_backend *b, be_bounds *r)
{
    cuda_impl *ci = impl_of(b);
    seg_op(ci, SEG_JOIN);   /* Quest's choice kept for attention: a decode step's layer, nothing waited for */
    const int H = r->n_head_kv;
    const int segs = r->bits != NULL;   /* SentKV's choice instead of the k best */
    if (segs) r->k = 0;
    if (r->k > BE_PICK_MAX) r->k = BE_PICK_MAX;
    const int32_t k = r->k;
    const size_t ids_bytes = sizeof(int32_t) * (size_t)(H * (k > 0 ? k : 0)), cnt_bytes = sizeof(int32_t) * (size_t)H;
    const size_t bits_bytes = segs ? sizeof(uint64_t) * (size_t)H * (size_t)r->words : 0;
    const int keep = k > 0 && bound(ci, r->best, ids_bytes) && bound(ci, r->n_best, cnt_bytes);
    const int keep_bits = segs && bound(ci, r->bits, bits_bytes);
    for (int h = 0; k > 0 && !keep && h < H; h++) r->n_best[h] = 0;
    if (ci->failed) return;
    int64_t stride;   /* a head's bounds: the most of any head's summaries */
    const int64_t n_all = be_bounds_total(r, &stride);
    size_t qbytes = sizeof(float) * (size_t)H * (size_t)r->group * (size_t)r->dim;
    const size_t seg_smem = sizeof(uint64_t) * (size_t)sg_sort_size(stride);
    int seg_host = segs && (n_all <= 0 || stride > SG_SORT_MAX || H > SL_MAX_HEADS);
    if (segs && !seg_host &&
        !smem_allowed((const void *)seg_choose_kernel, seg_smem, sizeof(int64_t) * (SG_THREADS + 2), &ci->seg_smem_set))
        seg_host = 1;   /* the host chooses */
    /* Quest's bounds and best in one launch where its best stay on the device (bound_best_kernel) */
    const int fused = keep && !r->u && !ci->bounds_split && stride <= SG_SORT_MAX && H <= SL_MAX_HEADS &&
                      smem_allowed((const void *)bound_best_kernel, seg_smem, sizeof(unsigned), &ci->best_smem_set);
    if (seg_host) {   /* no segments, or more than a block sorts: the bounds and the choice on the host */
        host_in(ci, r->q, qbytes);
        if (keep_bits) am_host_write(&ci->act, r->bits, bits_bytes);
        ci->cpu->ops->bound_pages(ci->cpu, r);
        return;
    }
    if (keep && n_all <= 0) {   /* nothing to choose: the counts written on the host, sent when read */
        am_host_write(&ci->act, r->n_best, cnt_bytes);
        for (int h = 0; h < H; h++) r->n_best[h] = 0;
        return;
    }
    if (n_all <= 0 || (k <= 0 && !segs && !r->u)) return;
    if (ci->batch.n && send_batch(ci)) return;   /* the batch holds this call's entries alone */
    const sl_list *L = update_sums(ci, r);
    if (!L) {
        if (ci->failed) return;   /* a round of the batch failed on its way (recorded) */
        /* no room on the device for the summaries (or too many heads): they are on the host, and
         * so are the CPU backend's threads (whose best, if kept, go up when attention reads them) */
        host_in(ci, r->q, qbytes);
        if (keep) {
            am_host_write(&ci->act, r->best, ids_bytes);
            am_host_write(&ci->act, r->n_best, cnt_bytes);
        }
        if (keep_bits) am_host_write(&ci->act, r->bits, bits_bytes);
        ci->cpu->ops->bound_pages(ci->cpu, r);
        return;
    }
    bd_counts cnt;
    for (int h = 0; h < H; h++) cnt.n[h] = be_bounds_count(r, h);
    const float *dq = bound(ci, r->q, qbytes) ? (const float *)am_dev_in(&ci->act, r->q, qbytes)
                                              : (const float *)stage(ci, r->q, qbytes);
    int64_t blocks[9];
    int rounds = k > 0 ? pk_plan(stride, k, blocks) : 0;
    size_t u_bytes = sizeof(float) * (size_t)(H * stride);
    size_t keys_bytes = k > 0 ? sizeof(uint64_t) * (size_t)(H * blocks[0] * k) : 0;
    size_t best_bytes = k > 0 ? sizeof(uint64_t) * (size_t)(H * k) : 0;
    size_t first_bytes = keep ? 0 : segs ? (keep_bits ? 0 : bits_bytes) : best_bytes;   /* what comes back first */
    size_t back = first_bytes + (r->u ? u_bytes : 0);
    if (!dq || grow_dev(ci, (void **)&ci->bd_u, &ci->cap_bd_u, u_bytes) ||
        (k > 0 && !fused && (grow_dev(ci, (void **)&ci->bd_keys, &ci->cap_bd_keys, 2 * keys_bytes + best_bytes) ||
                   grow_dev(ci, (void **)&ci->pick_max, &ci->cap_pick_max, sizeof(float) * (size_t)(H * blocks[0])))) ||
        (segs && grow_dev(ci, (void **)&ci->seg_at, &ci->cap_seg_at, sizeof(int64_t) * 2 * SG_SORT_MAX * (size_t)H)) ||
        (segs && !keep_bits && grow_dev(ci, (void **)&ci->seg_bits, &ci->cap_seg_bits, bits_bytes)) ||
        grow_host(ci, (void **)&ci->h_bd, &ci->cap_h_bd, back))
        return;
    cudaStream_t s = ci->stream;
    dim3 grid((unsigned)((stride + BD_PER_BLOCK - 1) / BD_PER_BLOCK), (unsigned)H);
    if (fused) {   /* one launch; the heads' tickets start at 0 (set once, again after a failure; each launch leaves them at 0) */
        const size_t done_bytes = sizeof(unsigned) * SL_MAX_HEADS;
        if (!ci->bd_done_zeroed) {
            if (grow_dev(ci, (void **)&ci->bd_done, &ci->cap_bd_done, done_bytes) ||
                ck(ci, cudaMemsetAsync(ci->bd_done, 0, ci->cap_bd_done, s), "bound tickets"))
                return;
            ci->bd_done_zeroed = 1;
        }
        int32_t *d_ids = (int32_t *)am_dev_out(&ci->act, r->best, ids_bytes);
        int32_t *d_cnt = (int32_t *)am_dev_out(&ci->act, r->n_best, cnt_bytes);
        bound_best_kernel<<<grid, BD_THREADS, seg_smem, s>>>(dq, r->group, r->dim, L->dev, L->cap, cnt, stride,
                                                             ci->bd_u, ci->bd_done, k, d_ids, d_cnt);
        ck(ci, cudaGetLastError(), "bound best kernel");
        return;
    }
    bound_kernel<<<grid, BD_THREADS, 0, s>>>(dq, r->group, r->dim, L->dev, L->cap, cnt, stride, ci->bd_u);
    if (ck(ci, cudaGetLastError(), "bound kernel")) return;
    uint64_t *best = ci->bd_keys + 2 * (keys_bytes / sizeof(uint64_t));
    if (segs) {   /* SentKV's choice where the bounds are; the bitmaps stay there when bound */
        uint64_t *d_bits = keep_bits ? (uint64_t *)am_dev_out(&ci->act, r->bits, bits_bytes) : ci->seg_bits;
        seg_choose_kernel<<<(unsigned)H, SG_THREADS, seg_smem, s>>>(ci->bd_u, stride, cnt, L->dev_n, L->cap,
                                                                    r->budget, r->sinks, r->len, d_bits, r->words,
                                                                    ci->seg_at);
        if (ck(ci, cudaGetLastError(), "segment choice kernel")) return;
        if (keep_bits && !r->u) return;
        if (!keep_bits &&
            ck(ci, cudaMemcpyAsync(ci->h_bd, ci->seg_bits, bits_bytes, cudaMemcpyDeviceToHost, s), "bound download"))
            return;
    } else if (k > 0) {
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
    const size_t u_at = first_bytes;
    if (r->u && ck(ci, cudaMemcpyAsync(ci->h_bd + u_at, ci->bd_u, u_bytes, cudaMemcpyDeviceToHost, s),
                   "bound download"))
        return;
    ci->bytes_down += back;
    if (sync_stream(ci, "bounds")) return;
    if (segs && !keep_bits) memcpy(r->bits, ci->h_bd, bits_bytes);
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

/* A selection's summaries put on the device now (be_ops.place_bounds), as bound_pages would before
 * its kernels: the list under r's name brought up to date and sent, nothing waited for. No room
 * for them is not an error here (the list is then forgotten, and the bounds call meets it). */
void cuda_place_bounds(be_backend *b, const be_bounds *r)
{
    cuda_impl *ci = impl_of(b);
    seg_op(ci, SEG_EAGER);
    if (ci->failed || be_bounds_total(r, NULL) <= 0) return;
    if (ci->batch.n && send_batch(ci)) return;
    update_sums(ci, r);
}
