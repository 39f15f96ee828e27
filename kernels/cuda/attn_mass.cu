/* attn_mass.cu - the CUDA backend's attention mass (be_ops.attn_mass: SnapKV's, H2O's, TAKE's and
 * LASER-KV's scores of the cached tokens), from the device's page copies (kernels/mass_kernels.h). */
#include "kernels/cuda/backend_cuda.cuh"

/* Block (page blockIdx.x, the pass's rows from MS_ROWS * blockIdx.y): the page's keys scored for the
 * block's rows of the page's KV head (kernels/mass_kernels.h), key i by half-warp i % 8 of the
 * block; KV head h's row r scores key j of the head at e[n * tok0[h] + r * T_h + j] (first: each
 * page's first token in its head). Both half-warps of a warp run every round (one may score a key
 * past the page's rows, a valid row's, and drop it), as their shuffles need. */
__global__ void __launch_bounds__(MS_THREADS) mass_score_kernel(ms_rows rows, const dev_page *pages,
                                                                 const int64_t *hp, const int64_t *tok0, int n_kv,
                                                                 const int64_t *first, float *e)
{
    __shared__ float qs[MS_ROWS * MS_MAX_D];
    const ms_rows q = rows;   /* a copy whose address the helpers take, not the parameter's */
    const dev_page pg = pages[blockIdx.x];
    const int h = ms_head_of(hp, n_kv, blockIdx.x);
    const int64_t rb = (int64_t)blockIdx.y * MS_ROWS, Th = tok0[h + 1] - tok0[h];
    const int nr = q.n - rb < MS_ROWS ? (int)(q.n - rb) : MS_ROWS, D = q.D;
    for (int x = threadIdx.x; x < MS_ROWS * D; x += MS_THREADS)   /* rows past the pass's end: zeros */
        qs[x] = x < nr * D ? ms_query(&q, h, rb + x / D)[x % D] : 0.0f;
    __syncthreads();
    const int lane = threadIdx.x % MS_LANES, half = threadIdx.x / MS_LANES, halves = MS_THREADS / MS_LANES;
    float *head_e = e + q.n * tok0[h] + first[blockIdx.x];
    for (int32_t i0 = half & ~1; i0 < pg.n; i0 += halves) {
        const int32_t i = i0 + (half & 1);
        const uint16_t *k = pg.k + (size_t)(i < pg.n ? i : i0) * (size_t)pg.stride;
        float v[MS_ROWS];
        ms_lane_parts(qs, k, D, lane, v);
        for (int st = 0; st < MS_TREE_STEPS; st++) {
            QB_UNROLL
            for (int r = 0; r < MS_ROWS; r++)
                v[r] = QB_ADD(v[r], __shfl_down_sync(0xffffffffu, v[r], ms_stride(st), MS_LANES));
        }
        if (lane != 0 || i >= pg.n) continue;
        QB_UNROLL
        for (int r = 0; r < MS_ROWS; r++)   /* unrolled, so v stays in registers */
            if (r < nr)
                head_e[(rb + r) * Th + i] =
                    ms_score(ms_tail(qs + r * D, k, D, v[r]), pg.bias, pg.pos, i, ms_q_pos(&q, rb + r));
    }
}

/* A block a (row blockIdx.x, KV head blockIdx.y): the row's largest score, every score made its
 * weight (in place), the weights' sum in MS_PARTS parts added pairwise, and the row's factor
 * (factor[h * n + r]). */
__global__ void __launch_bounds__(MS_PARTS) mass_weight_kernel(float *e, const int64_t *tok0, int64_t n, float *factor)
{
    __shared__ float mxs[MS_PARTS];
    __shared__ double parts[MS_PARTS];
    const int h = (int)blockIdx.y;
    const int64_t T = tok0[h + 1] - tok0[h];
    float *row = e + n * tok0[h] + (int64_t)blockIdx.x * T;
    const int u = threadIdx.x;
    float mx = -INFINITY;
    for (int64_t j = u; j < T; j += MS_PARTS)
        if (row[j] > mx) mx = row[j];
    mxs[u] = mx;
    __syncthreads();
    for (int st = MS_PARTS / 2; st >= 1; st /= 2) {   /* the same value in any order */
        if (u < st && mxs[u + st] > mxs[u]) mxs[u] = mxs[u + st];
        __syncthreads();
    }
    mx = mxs[0];
    float *f = factor + (int64_t)h * n + blockIdx.x;
    if (mx == -INFINITY) {   /* the whole block */
        if (u == 0) *f = MS_EMPTY;
        return;
    }
    for (int64_t j = u; j < T; j += MS_PARTS) row[j] = ms_weight(row[j], mx);
    parts[u] = ms_part(row, T, u);   /* the weights this thread wrote */
    __syncthreads();
    for (int st = MS_PARTS / 2; st >= 1; st /= 2) {
        ms_parts_step(parts, st, u);
        __syncthreads();
    }
    if (u == 0) *f = ms_factor(mx, parts[0]);
}

/* A thread a key (of every head's): its mass plus each of its head's rows' weight times the row's
 * factor, rows in order. */
__global__ void __launch_bounds__(MS_ADD_THREADS) mass_add_kernel(const float *e, const int64_t *tok0, int n_kv,
                                                                   int64_t n, const float *factor, float *acc)
{
    const int64_t j = (int64_t)blockIdx.x * MS_ADD_THREADS + threadIdx.x;
    if (j >= tok0[n_kv]) return;
    const int h = ms_head_of(tok0, n_kv, j);
    const int64_t T = tok0[h + 1] - tok0[h];
    acc[j] = ms_add(acc[j], e + n * tok0[h], T, n, factor + (int64_t)h * n, j - tok0[h]);
}

/* Floats of scores a pass holds on the device (32 MiB): the rows run in passes of at most this many. */
#define MS_WORK_FLOATS ((int64_t)1 << 23)

/* On the device from its copies of the pages (the list kept under m->table, as attention's), the
 * queries from where they are (bound: on the device; else only the heads' packed and sent), the
 * sums sent, added to and brought back: one wait. 0; 1 when memory for it was short (nothing
 * recorded, the batch dropped: the pages go up whole at their next use); or -1 with the failure
 * recorded. The caller has checked that no failure was recorded before. */
static int attn_mass_dev(cuda_impl *ci, const be_mass *m, int64_t T)
{
    const int H = m->n_kv > 1 ? m->n_kv : 1;
    const int64_t rows = m->n_q * m->group, D = m->head_dim, np = m->n_pages, hq = (int64_t)H * m->group;
    int64_t hp1[2] = { 0, np };
    const int64_t *hp = m->n_kv > 1 ? m->head_pages : hp1;
    pt_call pl;
    const int lc = policy_list(ci, m->table, 0, m->pages, np, hp, H, &pl);
    if (lc) return lc;
    const size_t qspan = sizeof(float) * (size_t)((m->n_q - 1) * m->q_stride + (m->first_head + hq) * D);
    const int q_bound = bound(ci, m->q, qspan);
    const size_t fb = sizeof(int64_t) * (size_t)(np + H + 1), ab = sizeof(float) * (size_t)T;
    const size_t qb = q_bound ? 0 : sizeof(float) * (size_t)(m->n_q * hq * D);
    if (fb + qb > ci->cap_ms_host) {
        void *nh = realloc(ci->ms_host, fb + qb);
        if (!nh) return 1;
        ci->ms_host = nh;
        ci->cap_ms_host = fb + qb;
    }
    int64_t *first = (int64_t *)ci->ms_host, *tok0 = first + np;
    ms_offsets(m->pages, hp, H, first, tok0);
    ms_rows r = { NULL, m->q_stride, m->q_pos0, 0, 0, m->first_head, m->group, (int)D };
    if (!q_bound) {   /* the heads' query rows only, side by side */
        float *pack = (float *)(tok0 + H + 1);
        for (int64_t t = 0; t < m->n_q; t++)
            memcpy(pack + t * hq * D, m->q + t * m->q_stride + m->first_head * D, sizeof(float) * (size_t)(hq * D));
        r.q_stride = hq * D;
        r.first_head = 0;
    }
    int64_t per = MS_WORK_FLOATS / T;
    if (per < 1) per = 1;
    if (per > rows) per = rows;
    if (per > (int64_t)MS_ROWS * 65535) per = (int64_t)MS_ROWS * 65535;
    if (grow_dev(ci, (void **)&ci->ms_e, &ci->cap_ms_e, sizeof(float) * (size_t)(per * T)) ||
        grow_dev(ci, (void **)&ci->ms_factor, &ci->cap_ms_factor, sizeof(float) * (size_t)(per * H)) ||
        grow_dev(ci, (void **)&ci->ms_acc, &ci->cap_ms_acc, ab) || grow_host(ci, (void **)&ci->h_ms, &ci->cap_h_ms, ab))
        return scratch_short(ci);   /* only allocations failed (each leaves its buffer empty) */
    if (stage_reserve(ci, stage_size(fb) + stage_size(ab) + stage_size(qb))) return -1;
    const int64_t *d_first = (const int64_t *)stage(ci, first, fb), *d_tok0 = d_first ? d_first + np : NULL;
    r.q = q_bound ? (const float *)am_dev_in(&ci->act, m->q, qspan) : (const float *)stage(ci, tok0 + H + 1, qb);
    if (!d_first || !r.q || send_to(ci, ci->ms_acc, m->acc, ab)) return -1;
    cudaStream_t s = ci->stream;
    for (r.r0 = 0; r.r0 < rows; r.r0 += per) {
        r.n = rows - r.r0 < per ? rows - r.r0 : per;
        mass_score_kernel<<<dim3((unsigned)np, (unsigned)((r.n + MS_ROWS - 1) / MS_ROWS)), MS_THREADS, 0, s>>>(
            r, pl.pages, pl.head_pages, d_tok0, H, d_first, ci->ms_e);
        mass_weight_kernel<<<dim3((unsigned)r.n, (unsigned)H), MS_PARTS, 0, s>>>(ci->ms_e, d_tok0, r.n, ci->ms_factor);
        mass_add_kernel<<<(unsigned)((T + MS_ADD_THREADS - 1) / MS_ADD_THREADS), MS_ADD_THREADS, 0, s>>>(
            ci->ms_e, d_tok0, H, r.n, ci->ms_factor, ci->ms_acc);
        if (ck(ci, cudaGetLastError(), "attention mass kernels")) return -1;
    }
    if (ck(ci, cudaMemcpyAsync(ci->h_ms, ci->ms_acc, ab, cudaMemcpyDeviceToHost, s), "attention mass download"))
        return -1;
    ci->bytes_down += ab;
    if (sync_stream(ci, "attention mass")) return -1;
    memcpy(m->acc, ci->h_ms, ab);
    return 0;
}

/* The eviction policies' attention mass: on the device where it can run (head dimensions up to
 * MS_MAX_D, memory for it); else, and once the device has failed, on the CPU backend's threads
 * from the host's pages and the queries the host has (a policy evicts by it, and an eviction by a
 * mass never computed could not be undone). Both give the same floats. */
void cuda_attn_mass(be_backend *b, const be_mass *m)
{
    cuda_impl *ci = impl_of(b);
    seg_op(ci, SEG_EAGER);
    if (m->n_q <= 0) return;
    int64_t T = 0;
    for (int64_t i = 0; i < m->n_pages; i++) T += m->pages[i].n;
    const int was_failed = ci->failed;
    if (!was_failed && T > 0 && m->group > 0 && m->head_dim > 0 && m->head_dim <= MS_MAX_D &&
        m->n_kv <= PT_MAX_HEADS && attn_mass_dev(ci, m, T) == 0)
        return;
    const int64_t hq = (int64_t)(m->n_kv > 1 ? m->n_kv : 1) * m->group;
    am_range r = { m->q,
                   sizeof(float) * (size_t)((m->n_q - 1) * m->q_stride + (m->first_head + hq) * m->head_dim) };
    if (!was_failed) am_host_read(&ci->act, &r, 1);   /* (a device path that failed just now may read) */
    ci->cpu->ops->attn_mass(ci->cpu, m);
}
