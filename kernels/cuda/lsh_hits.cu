/* lsh_hits.cu - the CUDA backend's SimHash recall (be_ops.lsh_hits: LASER-KV's), the keys coded
 * from the device's page copies by kernels/lsh_kernels.h's functions, the query rows' codes (a few
 * hundred a KV head) on the host. */
#include "kernels/cuda/backend_cuda.cuh"
#include "kernels/lsh_kernels.h"
#include "kernels/mass_kernels.h"

typedef struct lsh_args {
    const float *planes_t;
    const uint32_t *codes;   /* KV head h's round r sorted at codes + (h * rounds + r) * nq */
    int P, bits, rounds, D, n_kv;
    int64_t nq, pos_min;
} lsh_args;

/* Block: page blockIdx.x (of KV head h: its tokens' hits at hits + tok0[h] + first[page]), its
 * tokens LSH_TILE at a time (kernels/lsh_kernels.h). */
__global__ void __launch_bounds__(LSH_THREADS) lsh_hits_kernel(lsh_args a, const dev_page *pages, const int64_t *hp,
                                                                const int64_t *tok0, const int64_t *first,
                                                                int32_t *hits)
{
    __shared__ float ks[LSH_TILE * LSH_DEV_MAX_D];
    __shared__ uint32_t code[LSH_TILE * LSH_MAX_ROUNDS];
    __shared__ int32_t cnt[LSH_TILE];
    const dev_page pg = pages[blockIdx.x];
    const int h = ms_head_of(hp, a.n_kv, blockIdx.x);
    int32_t *out = hits + tok0[h] + first[blockIdx.x];
    const uint32_t *codes = a.codes + (int64_t)h * a.rounds * a.nq;
    for (int32_t t0 = 0; t0 < pg.n; t0 += LSH_TILE) {
        const int nt = pg.n - t0 < LSH_TILE ? pg.n - t0 : LSH_TILE;
        for (int x = threadIdx.x; x < nt * a.D; x += LSH_THREADS)
            ks[x] = qb_half(pg.k[(size_t)(t0 + x / a.D) * (size_t)pg.stride + (size_t)(x % a.D)]);
        for (int x = threadIdx.x; x < nt * a.rounds; x += LSH_THREADS) code[x] = 0;
        if (threadIdx.x < LSH_TILE) cnt[threadIdx.x] = 0;
        __syncthreads();
        for (int x = threadIdx.x; x < nt * a.P; x += LSH_THREADS) {   /* a warp: one token's planes */
            const int t = x / a.P, p = x % a.P;
            if (pg.pos[t0 + t] < a.pos_min) continue;
            const uint32_t bit = lsh_bit(lsh_dot(a.planes_t, a.P, p, ks + t * a.D, a.D), p % a.bits);
            if (bit) atomicOr(&code[t * a.rounds + p / a.bits], bit);
        }
        __syncthreads();
        for (int x = threadIdx.x; x < nt * a.rounds; x += LSH_THREADS) {
            const int t = x / a.rounds, r = x % a.rounds;
            if (pg.pos[t0 + t] >= a.pos_min) atomicAdd(&cnt[t], lsh_count(codes + r * a.nq, a.nq, code[x]));
        }
        __syncthreads();
        if (threadIdx.x < nt) out[t0 + threadIdx.x] = cnt[threadIdx.x];
        __syncthreads();
    }
}

/* On the device from its copies of the pages (the list under l->table, attention mass's for the
 * same layer), the planes, offsets and query codes staged: one wait. 0; 1 when memory for it was
 * short (nothing recorded; the batch dropped: the pages go up whole at their next use); or -1
 * with the failure recorded. The caller has checked that no failure was recorded before. */
static int lsh_dev(cuda_impl *ci, const be_lsh *l, int64_t T)
{
    const int H = l->n_kv > 1 ? l->n_kv : 1, P = l->rounds * l->bits, D = l->head_dim;
    const int64_t np = l->n_pages, nq = l->n_q * l->group;
    int64_t hp1[2] = { 0, np };
    const int64_t *hp = l->n_kv > 1 ? l->head_pages : hp1;
    pt_call pl;
    const int lc = policy_list(ci, l->table, 0, l->pages, np, hp, H, &pl);
    if (lc) return lc;
    be_host_lsh_query_codes(ci->cpu, l);   /* while the pages go up */
    const size_t fb = sizeof(int64_t) * (size_t)(np + H + 1), pb = sizeof(float) * (size_t)P * (size_t)D,
                 cb = sizeof(uint32_t) * (size_t)H * (size_t)l->rounds * (size_t)nq, hb = sizeof(int32_t) * (size_t)T;
    if (fb > ci->cap_ms_host) {
        void *nh = realloc(ci->ms_host, fb);
        if (!nh) return 1;
        ci->ms_host = nh;
        ci->cap_ms_host = fb;
    }
    int64_t *first = (int64_t *)ci->ms_host, *tok0 = first + np;
    ms_offsets(l->pages, hp, H, first, tok0);
    if (grow_dev(ci, (void **)&ci->lsh_hits, &ci->cap_lsh_hits, hb) ||
        grow_host(ci, (void **)&ci->h_lsh, &ci->cap_h_lsh, hb))
        return scratch_short(ci);   /* only allocations failed: the CPU computes the hits */
    if (stage_reserve(ci, stage_size(fb) + stage_size(pb) + stage_size(cb))) return -1;
    const int64_t *d_first = (const int64_t *)stage(ci, first, fb);
    const float *d_planes = (const float *)stage(ci, l->planes_t, pb);
    const uint32_t *d_codes = (const uint32_t *)stage(ci, l->codes, cb);
    if (!d_first || !d_planes || !d_codes) return -1;
    lsh_args a = { d_planes, d_codes, P, l->bits, l->rounds, D, H, nq, l->pos_min };
    cudaStream_t s = ci->stream;
    lsh_hits_kernel<<<(unsigned)np, LSH_THREADS, 0, s>>>(a, pl.pages, pl.head_pages, d_first + np, d_first,
                                                          ci->lsh_hits);
    if (ck(ci, cudaGetLastError(), "SimHash recall kernel") ||
        ck(ci, cudaMemcpyAsync(ci->h_lsh, ci->lsh_hits, hb, cudaMemcpyDeviceToHost, s), "SimHash recall download"))
        return -1;
    ci->bytes_down += hb;
    if (sync_stream(ci, "SimHash recall")) return -1;
    memcpy(l->hits, ci->h_lsh, hb);
    return 0;
}

/* LASER-KV's SimHash recall: on the device where it can run (head dimensions up to LSH_DEV_MAX_D,
 * memory for it); else, and once the device has failed, on the CPU backend's threads from the
 * host's pages (a policy evicts by it). Both give the same hits. */
void cuda_lsh_hits(be_backend *b, const be_lsh *l)
{
    cuda_impl *ci = impl_of(b);
    seg_op(ci, SEG_EAGER);
    int64_t T = 0;
    for (int64_t i = 0; i < l->n_pages; i++) T += l->pages[i].n;
    if (!ci->failed && l->n_q > 0) {   /* the query rows are coded on the host */
        const int64_t hq = (int64_t)(l->n_kv > 1 ? l->n_kv : 1) * l->group;
        am_range r = { l->q, sizeof(float) * (size_t)((l->n_q - 1) * l->q_stride + (l->first_head + hq) * l->head_dim) };
        am_host_read(&ci->act, &r, 1);
    }
    if (!ci->failed && l->n_q > 0 && T > 0 && l->group > 0 && l->head_dim > 0 && l->head_dim <= LSH_DEV_MAX_D &&
        l->rounds <= LSH_MAX_ROUNDS && l->n_kv <= PT_MAX_HEADS && lsh_dev(ci, l, T) == 0)
        return;
    ci->cpu->ops->lsh_hits(ci->cpu, l);   /* (no query rows: every count 0, as the CPU writes them) */
}
