/* pick.cu - the CUDA backend's choice of candidates (be_ops.pick; the CPU's is kernels/cpu/pick.c):
 * the k best of the logits where the output product left them, the soft cap and the entropy
 * (kernels/pick_kernels.h), and the same k best for any rows of values (pick_k_best: the
 * selection policies' bounds). */
#include "kernels/cuda/backend_cuda.cuh"

/* The block's PK_SLICE keys sorted, largest first (every thread of the block calls it), and the k
 * first written to out. */
static __device__ void sort_and_keep(uint64_t *keys, int32_t k, uint64_t *out)
{
    const int tid = threadIdx.x;
    for (int size = 2; size <= PK_SLICE; size <<= 1)
        for (int stride = size / 2; stride > 0; stride >>= 1) {
            pk_sort_step(keys, size, stride, tid);
            __syncthreads();
        }
    for (int i = tid; i < k; i += PK_THREADS) out[i] = keys[i];
}

/* A slice of the row a block (kernels/pick_kernels.h): its k best keys to out[blockIdx.x * k ..],
 * its largest value before the penalty to slice_max. Rows row_stride apart, one a blockIdx.y (the
 * bounds' KV heads; the sampler's pick has one), each with its own out and slice_max. */
__global__ void __launch_bounds__(PK_THREADS) pick_slice_kernel(const float *logits, int64_t n, int64_t row_stride,
                                                                  const int32_t *pen, int32_t n_pen, float penalty,
                                                                  int32_t k, uint64_t *out, float *slice_max)
{
    __shared__ uint64_t keys[PK_SLICE];
    __shared__ uint32_t pen_bits[PK_SLICE / 32];
    __shared__ float red[PK_THREADS / 32];
    const int tid = threadIdx.x;
    logits += blockIdx.y * row_stride;
    out += (int64_t)blockIdx.y * gridDim.x * k;
    slice_max += (int64_t)blockIdx.y * gridDim.x;
    const int64_t base = (int64_t)blockIdx.x * PK_SLICE;
    if (tid < PK_SLICE / 32) pen_bits[tid] = 0;
    __syncthreads();
    for (int32_t j = tid; j < n_pen; j += PK_THREADS) {
        int64_t o = (int64_t)pen[j] - base;
        if (o >= 0 && o < PK_SLICE) atomicOr(&pen_bits[o >> 5], 1u << (o & 31));
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int r = 0; r < PK_PER_THREAD; r++) {
        float raw;
        int slot = tid + r * PK_THREADS;
        keys[slot] = pk_token_key(logits, n, pen_bits, penalty, base, slot, &raw);
        mx = fmaxf(mx, raw);
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((tid & 31) == 0) red[tid >> 5] = mx;
    __syncthreads();
    sort_and_keep(keys, k, out + (int64_t)blockIdx.x * k);
    if (tid == 0) {
        float m = red[0];
        for (int w = 1; w < PK_THREADS / 32; w++) m = fmaxf(m, red[w]);
        slice_max[blockIdx.x] = m;
    }
}

/* A merge round: block b sorts lists [b * (PK_SLICE / k), ...) of in and keeps their k best; a row's
 * n_lists lists a blockIdx.y. */
__global__ void __launch_bounds__(PK_THREADS) pick_merge_kernel(const uint64_t *in, int64_t n_lists, int32_t k,
                                                                  uint64_t *out)
{
    __shared__ uint64_t keys[PK_SLICE];
    const int tid = threadIdx.x;
    in += (int64_t)blockIdx.y * n_lists * k;
    out += (int64_t)blockIdx.y * gridDim.x * k;
    const int64_t first = (int64_t)blockIdx.x * (PK_SLICE / k);
    for (int r = 0; r < PK_PER_THREAD; r++) {
        int slot = tid + r * PK_THREADS;
        keys[slot] = pk_merge_key(in, n_lists, k, first, slot);
    }
    __syncthreads();
    sort_and_keep(keys, k, out + (int64_t)blockIdx.x * k);
}

/* The k best keys of each of n_rows rows of n values (row_stride apart; pen/n_pen/penalty as the
 * sampler's repetition penalty) to best[row * k ..]: a slice kernel, then the merge rounds of
 * pk_plan(n, k, blocks) (rounds of them). scratch: 2 * n_rows * blocks[0] * k keys; slice_max:
 * n_rows * blocks[0] floats (each slice's largest value, for the entropy). A failure's message
 * begins with `what` ("" for the sampler's, "bound " for the bounds'). 0, or -1 (recorded). */
int pick_k_best(cuda_impl *ci, const float *x, int64_t n, int64_t row_stride, int n_rows, const int32_t *pen,
                int32_t n_pen, float penalty, int32_t k, const int64_t *blocks, int rounds, uint64_t *scratch,
                float *slice_max, uint64_t *best, const char *what)
{
    cudaStream_t s = ci->stream;
    uint64_t *lists[2] = { scratch, scratch + (int64_t)n_rows * blocks[0] * k };
    pick_slice_kernel<<<dim3((unsigned)blocks[0], (unsigned)n_rows), PK_THREADS, 0, s>>>(
        x, n, row_stride, pen, n_pen, penalty, k, rounds == 0 ? best : lists[0], slice_max);
    /* constant names: a recording's signature is its sites' names (step_graphs.h) */
    const int bounds = what[0] != 0;
    if (ck(ci, cudaGetLastError(), bounds ? "bound pick kernel" : "pick kernel")) return -1;
    for (int r = 1; r <= rounds; r++) {
        uint64_t *dst = r == rounds ? best : lists[r & 1];
        pick_merge_kernel<<<dim3((unsigned)blocks[r], (unsigned)n_rows), PK_THREADS, 0, s>>>(lists[(r - 1) & 1],
                                                                                          blocks[r - 1], k, dst);
        if (ck(ci, cudaGetLastError(), bounds ? "bound pick merge kernel" : "pick merge kernel")) return -1;
    }
    return 0;
}

/* Each slice's entropy sums relative to the row's largest value (from the slices' maxima). */
__global__ void __launch_bounds__(PK_THREADS) pick_entropy_kernel(const float *logits, int64_t n,
                                                                    const float *slice_max, int64_t n_slices,
                                                                    float inv, double *sums)
{
    __shared__ double acc[PK_THREADS][3];
    __shared__ float red[PK_THREADS / 32];
    const int tid = threadIdx.x;
    /* the row's largest value: the slices' maxima shared out among the block's threads */
    float mx = -INFINITY;
    for (int64_t i = tid; i < n_slices; i += PK_THREADS) mx = fmaxf(mx, slice_max[i]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((tid & 31) == 0) red[tid >> 5] = mx;
    __syncthreads();
    mx = red[0];
    for (int w = 1; w < PK_THREADS / 32; w++) mx = fmaxf(mx, red[w]);
    double a[3] = { 0, 0, 0 };
    if (isfinite(mx)) pk_entropy_thread(logits, n, (int64_t)blockIdx.x * PK_SLICE, tid, mx, inv, a);
    acc[tid][0] = a[0], acc[tid][1] = a[1], acc[tid][2] = a[2];
    __syncthreads();
    for (int s = PK_THREADS / 2; s > 0; s >>= 1) {
        pk_tree_step(acc, s, tid);
        __syncthreads();
    }
    if (tid < 3) sums[blockIdx.x * 3 + tid] = acc[0][tid];
}

/* The final soft cap, in place (the row's readers after the pick see these values). */
__global__ void pick_softcap_kernel(float *l, int64_t n, float cap)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) l[i] = lp_cap(l[i], cap);
}

/* The row's entropy and varentropy from the slices' sums, added in slice order. */
__global__ void pick_entropy_finish(const double *sums, const float *slice_max, int64_t n_slices, double *out)
{
    float mx = -INFINITY;
    for (int64_t i = 0; i < n_slices; i++) mx = fmaxf(mx, slice_max[i]);
    double acc[3] = { 0, 0, 0 };
    for (int64_t i = 0; i < n_slices; i++)
        for (int j = 0; j < 3; j++) acc[j] += sums[i * 3 + j];
    out[0] = out[1] = 0;
    if (isfinite(mx)) lp_entropy_finish(acc, &out[0], &out[1]);
}

/* One row's candidates launched, its answer (entropy, varentropy, then the k best keys) into the
 * device's answer area at res; 0, or -1 when a launch failed (ci->failed). */
static int pick_issue(cuda_impl *ci, be_pick *p, uint8_t *res)
{
    int64_t blocks[9];
    int rounds = pk_plan(p->n, p->k, blocks);
    int32_t n_pen = p->n_pen < 0 ? 0 : p->n_pen < 4096 ? p->n_pen : 4096;
    const int32_t *d_pen = NULL;
    if (n_pen > 0 && !(d_pen = (const int32_t *)stage(ci, p->pen_ids, sizeof(int32_t) * (size_t)n_pen))) return -1;
    float *dl = (float *)am_dev_out(&ci->act, p->logits, sizeof(float) * (size_t)p->n);   /* read, and capped in place */
    cudaStream_t s = ci->stream;
    if (p->softcap > 0) {
        pick_softcap_kernel<<<(unsigned)((p->n + EW_THREADS - 1) / EW_THREADS), EW_THREADS, 0, s>>>(dl, p->n, p->softcap);
        if (ck(ci, cudaGetLastError(), "soft cap kernel")) return -1;
    }
    if (pick_k_best(ci, dl, p->n, 0, 1, d_pen, n_pen, p->penalty, p->k, blocks, rounds, ci->pick_keys, ci->pick_max,
                    (uint64_t *)(res + 16), ""))
        return -1;
    if (p->entropy) {
        float temp = p->temp > 0 ? p->temp : 1.0f;
        pick_entropy_kernel<<<(unsigned)blocks[0], PK_THREADS, 0, s>>>(dl, p->n, ci->pick_max, blocks[0], 1.0f / temp,
                                                                       ci->pick_sums);
        pick_entropy_finish<<<1, 1, 0, s>>>(ci->pick_sums, ci->pick_max, blocks[0], (double *)res);
        if (ck(ci, cudaGetLastError(), "pick entropy kernel")) return -1;
    }
    return 0;
}

/* A row's answer as it came back (h: its slot of the host's copy of the answer area). */
static void pick_answer(be_pick *p, const uint8_t *h)
{
    if (p->entropy) {
        memcpy(&p->h, h, sizeof p->h);
        memcpy(&p->vh, h + 8, sizeof p->vh);
    }
    for (int32_t i = 0; i < p->k; i++) {
        uint64_t key;
        memcpy(&key, h + 16 + sizeof key * (size_t)i, sizeof key);
        if (key == 0) break;
        p->val[i] = lp_key_value(key);
        p->id[i] = lp_key_id(key);
        p->n_out = i + 1;
    }
}

/* n rows' picks with one wait for all of them (a batch's decode step): every row's kernels run one
 * after another on the stream, sharing the scratch, each answer into its own slot of the answer
 * area, which comes back in one copy. */
void cuda_pick(be_backend *b, be_pick *ps, int n)
{
    cuda_impl *ci = impl_of(b);
    seg_op(ci, SEG_JOIN);   /* a decode step's last op: its wait runs the recording */
    const size_t slot = 16 + sizeof(uint64_t) * BE_PICK_MAX;
    int64_t most_keys = 0, most_slices = 0;
    size_t staged = 0;   /* the rows' penalty ids, staged together */
    int last = -1;   /* the last row the device answers */
    for (int i = 0; i < n; i++) {
        be_pick *p = &ps[i];
        p->n_out = 0;
        p->h = p->vh = 0;
        if (ci->failed || p->n <= 0) continue;
        if (!bound(ci, p->logits, sizeof(float) * (size_t)p->n)) {   /* host logits: the CPU's pick */
            am_range r = { p->logits, sizeof(float) * (size_t)p->n };
            am_host_read(&ci->act, &r, 1);
            ci->cpu->ops->pick(ci->cpu, p, 1);
            continue;
        }
        p->k = p->k < 1 ? 1 : p->k > BE_PICK_MAX ? BE_PICK_MAX : p->k;
        int64_t blocks[9];
        pk_plan(p->n, p->k, blocks);
        const int64_t keys = blocks[0] * p->k;   /* the first round's, the most a round holds */
        most_keys = keys > most_keys ? keys : most_keys;
        most_slices = blocks[0] > most_slices ? blocks[0] : most_slices;
        if (p->n_pen > 0) staged += stage_size(sizeof(int32_t) * (size_t)(p->n_pen < 4096 ? p->n_pen : 4096));
        last = i;
    }
    if (last < 0 || ci->failed) return;
    /* the scratch for the largest row, grown before any launch (growing frees what earlier launches
     * use), and the staging for every row's penalty ids (making room waits: once, here, if at all);
     * the answers back up to the last row's k keys */
    const size_t res_bytes = slot * (size_t)last + 16 + sizeof(uint64_t) * (size_t)ps[last].k;
    if (grow_dev(ci, (void **)&ci->pick_keys, &ci->cap_pick_keys, 2 * sizeof(uint64_t) * (size_t)most_keys) ||
        grow_dev(ci, (void **)&ci->pick_max, &ci->cap_pick_max, sizeof(float) * (size_t)most_slices) ||
        grow_dev(ci, (void **)&ci->pick_sums, &ci->cap_pick_sums, sizeof(double) * 3 * (size_t)most_slices) ||
        grow_dev(ci, (void **)&ci->pick_res, &ci->cap_pick_res, slot * (size_t)(last + 1)) ||
        grow_host(ci, (void **)&ci->h_pick, &ci->cap_h_pick, slot * (size_t)(last + 1)) ||
        (staged && stage_reserve(ci, staged)))
        return;
    for (int i = 0; i <= last; i++)
        if (!ci->failed && ps[i].n > 0 && bound(ci, ps[i].logits, sizeof(float) * (size_t)ps[i].n) &&
            pick_issue(ci, &ps[i], ci->pick_res + slot * (size_t)i))
            return;
    if (ci->failed) return;   /* a row's inputs failed to go up: no answer is read */
    ci->bytes_down += res_bytes;
    if (ck(ci, cudaMemcpyAsync(ci->h_pick, ci->pick_res, res_bytes, cudaMemcpyDeviceToHost, ci->stream), "pick download") ||
        sync_stream(ci, "pick"))
        return;
    for (int i = 0; i <= last; i++)
        if (ps[i].n > 0 && bound(ci, ps[i].logits, sizeof(float) * (size_t)ps[i].n)) pick_answer(&ps[i], ci->h_pick + slot * (size_t)i);
}
