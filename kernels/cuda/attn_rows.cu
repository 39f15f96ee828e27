/* attn_rows.cu - the CUDA backend's attention over the KV pages (be_ops.attention; the CPU's is
 * kernels/attn_rows.c): the scalar kernel (a block per query head), the grouped kernel (a GQA group
 * reads each page once, kernels/attn_group.h), the flash kernel for prefill chunks on the tensor
 * cores (kernels/attn_flash.h), their split combine, and a selection's list gathered on the device. */
#include "kernels/cuda/backend_cuda.cuh"

#define ATT_THREADS 128     /* keys scored at once by one attention block; its threads */
#define MAX_D_PER_THREAD 4  /* head_dim up to 512 */

static __device__ float block_max(float v, float *red)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) red[wid] = v;
    __syncthreads();
    float r = red[0];
    for (int i = 1; i < ATT_THREADS / 32; i++) r = fmaxf(r, red[i]);
    return r;
}

static __device__ float block_sum(float v, float *red)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) red[wid] = v;
    __syncthreads();
    float r = 0;
    for (int i = 0; i < ATT_THREADS / 32; i++) r += red[i];
    return r;
}

/* One block per (query head, query, split of its KV head's pages): online softmax over that slice of
 * the pages, ATT_THREADS keys at a time (one key per thread for the scores, then each thread
 * accumulates its share of the head's dimensions over those keys); the unnormalised output, maximum
 * and sum of each split go to part_*, merged by attn_combine. Splits give a decode step (one query,
 * a few heads) enough blocks to fill the device. */
__global__ void attn_kernel(const float *q, const int32_t *q_pos, const dev_page *pages, int64_t n_pages,
                            const int64_t *head_pages, const uint64_t *masks, int n_head, int group, int D,
                            int32_t window, int n_split, float *part_o, float *part_ml)
{
    extern __shared__ float sh[];
    float *sq = sh;                 /* [D] the query */
    float *sp = sq + D;             /* [ATT_THREADS] scores, then weights */
    float *red = sp + ATT_THREADS;  /* [ATT_THREADS / 32] */
    int h = blockIdx.x, g = h / group, tid = threadIdx.x;
    int64_t t = blockIdx.y;
    int32_t qp = q_pos[t];
    const float *qt = q + (t * n_head + h) * (int64_t)D;
    for (int d = tid; d < D; d += ATT_THREADS) sq[d] = qt[d];
    float acc[MAX_D_PER_THREAD];
    for (int j = 0; j < MAX_D_PER_THREAD; j++) acc[j] = 0;
    float m = -INFINITY, l = 0;
    int64_t h0 = head_pages ? head_pages[g] : 0, h1 = head_pages ? head_pages[g + 1] : n_pages;
    int64_t per = (h1 - h0 + n_split - 1) / n_split, p0 = h0 + blockIdx.z * per;
    int64_t p1 = p0 + per < h1 ? p0 + per : h1;
    __syncthreads();
    for (int64_t ip = p0; ip < p1; ip++) {
        const dev_page pg = pages[ip];
        if (pg.n <= 0) continue;
        const __half *kb = (const __half *)pg.k + (int64_t)g * pg.head_step;
        const __half *vb = (const __half *)pg.v + (int64_t)g * pg.head_step;
        for (int32_t k0 = 0; k0 < pg.n; k0 += ATT_THREADS) {
            int32_t i = k0 + tid;
            float s = -INFINITY;
            if (i < pg.n) {
                int32_t kp = pg.pos[i];
                int vis = kp <= qp && !(window > 0 && qp - kp >= window);
                if (vis && pg.mask_off >= 0) vis = (int)((masks[pg.mask_off + (i >> 6)] >> (i & 63)) & 1u);
                if (vis) {
                    const __half *kr = kb + (int64_t)i * pg.stride;
                    float dot = 0;
                    for (int d = 0; d < D; d++) dot += sq[d] * __half2float(kr[d]);
                    s = dot + (pg.bias ? pg.bias[i] : 0.0f);
                }
            }
            float mx = block_max(s, red);
            if (mx == -INFINITY) continue;   /* nothing visible in this block: every thread agrees */
            float nm = fmaxf(m, mx);
            float p = s == -INFINITY ? 0.0f : __expf(s - nm);
            float psum = block_sum(p, red);
            float corr = m == -INFINITY ? 0.0f : __expf(m - nm);
            l = l * corr + psum;
            m = nm;
            sp[tid] = p;
            __syncthreads();
            int32_t nk = pg.n - k0 < ATT_THREADS ? pg.n - k0 : ATT_THREADS;
            for (int j = 0; j < MAX_D_PER_THREAD; j++) {
                int d = tid + j * ATT_THREADS;
                if (d >= D) break;
                float a = acc[j] * corr;
                for (int32_t kk = 0; kk < nk; kk++) {
                    float w = sp[kk];
                    if (w != 0.0f) a += w * __half2float(vb[(int64_t)(k0 + kk) * pg.stride + d]);
                }
                acc[j] = a;
            }
            __syncthreads();   /* sp is rewritten by the next block of keys */
        }
    }
    int64_t row = (t * n_head + h) * n_split + blockIdx.z;
    for (int j = 0; j < MAX_D_PER_THREAD; j++) {
        int d = tid + j * ATT_THREADS;
        if (d < D) part_o[row * D + d] = acc[j];
    }
    if (tid == 0) part_ml[row * 2] = m, part_ml[row * 2 + 1] = l;
}

/* Every attention kernel's splits merged (row r = t * n_head + h, query t's list's splits, L.stride
 * apart) with ag_combine_one's bits, the way ag_combine_tiled runs on the host: the largest maximum
 * by a tree over the block, then tile by tile every split's weight side by side and the sums in
 * split order, a thread an element d. grid (n_head, n_q), threads min(D, 256). */
__global__ void attn_combine(const float *part_o, const float *part_ml, const __grid_constant__ ag_lists L, int n_head,
                             int D, float *out, int8_t *q, float *qd, float *qs)
{
    __shared__ float f[AG_CTILE], l[AG_CTILE], red[256];
    __shared__ unsigned char skip[AG_CTILE];
    const int64_t r = (int64_t)blockIdx.y * n_head + blockIdx.x, r0 = r * L.stride;
    const int n_split = ag_list_of(&L, blockIdx.y).n_split, tid = (int)threadIdx.x, nth = (int)blockDim.x;
    float M = -INFINITY;
    for (int z = tid; z < n_split; z += nth) M = ag_combine_max(M, part_ml[(r0 + z) * 2]);
    red[tid] = M;
    __syncthreads();
    for (int w = 1; w < nth; w <<= 1) {   /* a maximum is the same in any order */
        if (tid % (2 * w) == 0 && tid + w < nth) red[tid] = ag_combine_max(red[tid], red[tid + w]);
        __syncthreads();
    }
    M = red[0];
    /* one pass for D <= 256 (the grouped and flash kernels'); the scalar kernel's larger heads take more */
    for (int d0 = 0; d0 < D; d0 += nth) {
        const int d = d0 + tid;
        float Ls = 0.0f, o = 0.0f;
        for (int t0 = 0; t0 < n_split; t0 += AG_CTILE) {
            const int nt = n_split - t0 < AG_CTILE ? n_split - t0 : AG_CTILE;
            __syncthreads();   /* every thread done with the tile before */
            for (int j = tid; j < nt; j += nth) {
                f[j] = ag_combine_weight(part_ml[(r0 + t0 + j) * 2], M, &skip[j]);
                l[j] = part_ml[(r0 + t0 + j) * 2 + 1];
            }
            __syncthreads();
            if (d < D) ag_combine_tile(f, l, skip, nt, part_o + (r0 + t0) * D + d, D, &Ls, &o);
        }
        if (d >= D) continue;   /* a whole warp when D % 32 == 0, as q needs */
        const float v = ag_combine_out(Ls, o);
        out[r * D + d] = v;
        /* with q (D % 32 == 0, blockDim a multiple of 32): the output product's input codes, a
         * warp's 32 consecutive values one block */
        if (q) quantize_warp_block(v, tid & 31, (r * D + d) / DD_QBLOCK, q, qd, qs);
    }
}

/* The grouped kernel's block (kernels/attn_group.h): one block per (KV head and a batch of up to
 * AG_HEADS of its query heads, query, split of the head's pages in its query's list: `pages` ..,
 * n_split splits, partials `stride` apart). grid (n_head_kv * batches, n_q, stride), AG_THREADS
 * threads. Each page is read once for the batch's heads. hold: 0 (ag_hold_for_every_fetch). */
template <int ROWS>
static __device__ __forceinline__ void attn_group_block(const float *q, const int32_t *q_pos, const ag_page *pages,
                                                        int64_t n_pages, const int64_t *head_pages,
                                                        const uint64_t *masks, int n_split, int stride, int n_head,
                                                        int group, int D, int32_t window, uint32_t hold,
                                                        float *part_o, float *part_ml)
{
    __shared__ ag_state sw[AG_THREADS / 32 - 1][32];   /* warps 1.. : their slot 0's lanes */
    __shared__ ag_page staged[AG_PCHUNK];
    const int nhb = ag_head_batches(group), g = blockIdx.x / nhb, bt = blockIdx.x % nhb;
    const int h0 = g * group + bt * AG_HEADS, hb = ag_batch_heads(group, bt);
    const int64_t t = blockIdx.y;
    if ((int)blockIdx.z >= n_split) return;   /* past its list's splits: the whole block */
    const int32_t qp = q_pos[t];
    const int lk = ag_lanes_per_key(D), slots = AG_THREADS / lk;
    const int tid = threadIdx.x, ls = tid % lk, lane = tid & 31, warp = tid >> 5;
    float qv[1][AG_HEADS][AG_DL];
    QB_UNROLL
    for (int h = 0; h < AG_HEADS; h++)
        for (int j = 0; j < AG_DL; j++) {
            const int d = ls * AG_DL + j;
            qv[0][h][j] = h < hb && d < D ? q[(t * n_head + h0 + h) * (int64_t)D + d] : 0.0f;
        }
    ag_state st[1];
    ag_state_init(&st[0]);
    int64_t p0, p1;
    ag_split_range(head_pages, n_pages, g, n_split, (int)blockIdx.z, &p0, &p1);
    for (int64_t c = p0; c < p1; c += AG_PCHUNK) {
        const int nc = p1 - c < AG_PCHUNK ? (int)(p1 - c) : AG_PCHUNK;
        __syncthreads();   /* the last chunk's pages read by every slot */
        if (tid < nc) staged[tid] = ag_stage(&pages[c + tid], qp);
        __syncthreads();
        ag_slot_run(staged, nc, masks, g, qp, window, tid / lk, slots, lk, ls, 1, D, hb, ROWS, hold,
                    (const float(*)[AG_HEADS][AG_DL])qv, st);
    }
    /* the warp's slots: lane l merges lane l ^ o's state (ag_block_sim's order) */
    for (int o = lk; o < 32; o <<= 1) {
        QB_UNROLL
        for (int h = 0; h < AG_HEADS; h++) {
            if (h >= hb) continue;
            float o2[AG_DL];
            const float m2 = __shfl_xor_sync(0xffffffffu, st[0].m[h], o);
            const float l2 = __shfl_xor_sync(0xffffffffu, st[0].l[h], o);
            for (int j = 0; j < AG_DL; j++) o2[j] = __shfl_xor_sync(0xffffffffu, st[0].o[h][j], o);
            ag_merge(&st[0].m[h], &st[0].l[h], st[0].o[h], m2, l2, o2);
        }
    }
    if (warp > 0 && lane < lk) sw[warp - 1][lane] = st[0];
    __syncthreads();
    if (warp > 0 || lane >= lk) return;
    for (int w = 1; w < AG_THREADS / 32; w++) {
        const ag_state *b = &sw[w - 1][lane];
        QB_UNROLL
        for (int h = 0; h < AG_HEADS; h++)
            if (h < hb) ag_merge(&st[0].m[h], &st[0].l[h], st[0].o[h], b->m[h], b->l[h], b->o[h]);
    }
    QB_UNROLL
    for (int h = 0; h < AG_HEADS; h++) {
        if (h >= hb) continue;
        const int64_t row = (t * n_head + h0 + h) * stride + blockIdx.z;
        for (int j = 0; j < AG_DL; j++)
            if (lane * AG_DL + j < D) part_o[row * D + lane * AG_DL + j] = st[0].o[h][j];
        if (lane == 0) part_ml[row * 2] = st[0].m[h], part_ml[row * 2 + 1] = st[0].l[h];
    }
}

/* The grouped kernel: every query reads one list (a call's), n_split splits; ROWS rows a slot's
 * round (KVCHAT_CUDA_ATTN_ROWS). */
template <int ROWS>
__global__ void __launch_bounds__(AG_THREADS, AG_MIN_BLOCKS(ROWS))
    attn_group_kernel(const float *q, const int32_t *q_pos, const ag_page *pages, int64_t n_pages,
                      const int64_t *head_pages, const uint64_t *masks, int n_head, int group, int D, int32_t window,
                      int n_split, uint32_t hold, float *part_o, float *part_ml)
{
    attn_group_block<ROWS>(q, q_pos, pages, n_pages, head_pages, masks, n_split, n_split, n_head, group, D, window,
                           hold, part_o, part_ml);
}

/* Joined calls' (cuda_attention_seqs): query t reads list t (ag_list_of, L.n > 1), indexed where
 * the parameter is (__grid_constant__); a kernel of its own, since the list's fields found at run
 * time hold registers the one-list kernel keeps in the parameter bank. */
template <int ROWS>
__global__ void __launch_bounds__(AG_THREADS, AG_MIN_BLOCKS(ROWS))
    attn_group_lists_kernel(const float *q, const int32_t *q_pos, const __grid_constant__ ag_lists L, int n_head,
                            int group, int D, int32_t window, uint32_t hold, float *part_o, float *part_ml)
{
    const ag_list &l = L.l[blockIdx.y];
    attn_group_block<ROWS>(q, q_pos, l.pages, l.n_pages, l.head_pages, l.masks, l.n_split, L.stride, n_head, group,
                           D, window, hold, part_o, part_ml);
}

/* A prefill chunk's attention on the tensor cores (kernels/attn_flash.h): one block per (rt * 16
 * query rows, KV head and batch of its query heads, split of the head's pages); warps per (row tile,
 * head, half of the output dimensions); key tiles of AF_KT rows through two stages of shared memory.
 * grid (ceil(n_q / (rt * 16)), n_head_kv * batches, n_split), af_shape_of(D, group).warps * 32
 * threads, af_smem_bytes of shared memory. One split writes the rows; more write partials for
 * attn_combine. */
__global__ void __launch_bounds__(AF_WARPS * 32) attn_flash_kernel(const float *q, const int32_t *q_pos, int64_t n_q,
                                                                   const ag_page *pages, int64_t n_pages,
                                                                   const int64_t *head_pages, const uint64_t *masks,
                                                                   int n_head, int group, int D, int32_t window,
                                                                   int has_bias, int n_split, float *out,
                                                                   float *part_o, float *part_ml)
{
    extern __shared__ __align__(16) unsigned char af_mem[];
    const af_shape sh = af_shape_of(D, group);
    const int nhb = ag_head_batches(group), g = blockIdx.y / nhb, bt = blockIdx.y % nhb;
    const int h0 = g * group + bt * AG_HEADS, hb_b = ag_batch_heads(group, bt);
    const int tid = threadIdx.x, nt = blockDim.x, wi = tid >> 5, lane = tid & 31;
    const int rt = wi / (sh.hb * sh.ds), hh = (wi / sh.ds) % sh.hb, ds = wi % sh.ds;
    const int64_t row0 = (int64_t)blockIdx.x * sh.rt * 16;
    const af_smem m = af_smem_at(af_mem, D, sh);
    af_fill_q(m, q, n_q, n_head, D, sh, row0, h0, hb_b, tid, nt);
    int32_t minp, maxp, wlo, wmax;
    af_row_span(q_pos, n_q, row0, sh.rt * 16, &minp, &maxp);
    af_row_span(q_pos, n_q, row0 + rt * 16, 16, &wlo, &wmax);
    int32_t qp[1][2];
    for (int h = 0; h < 2; h++) {
        const int64_t r = row0 + rt * 16 + (lane >> 2) + 8 * h;
        qp[0][h] = r < n_q ? q_pos[r] : INT32_MIN;
    }
    af_lane s[1];
    af_lane_init(&s[0]);
    const size_t qoff = (size_t)(rt * sh.hb + hh) * 16 * (size_t)(D + AF_PAD);
    int64_t p0, p1;
    ag_split_range(head_pages, n_pages, g, n_split, (int)blockIdx.z, &p0, &p1);
    af_cursor cc = af_settle(pages, p0, 0, p1, minp, maxp, window), cl = cc;   /* computed, loaded */
    if (cl.ip < p1) {
        af_load_tile(m.s0, &pages[cl.ip], cl.r0, masks, g, D, tid, nt);
        cl = af_settle(pages, cl.ip, cl.r0 + AF_KT, p1, minp, maxp, window);
    }
    af_cp_commit();
    for (int i = 0; cc.ip < p1; i++) {
        if (cl.ip < p1) {   /* the next tile loads while this one is used */
            af_load_tile(af_stage_of(m, (i + 1) & 1), &pages[cl.ip], cl.r0, masks, g, D, tid, nt);
            cl = af_settle(pages, cl.ip, cl.r0 + AF_KT, p1, minp, maxp, window);
        }
        af_cp_commit();
        af_cp_wait1();
        __syncthreads();
        const af_stage st = af_stage_of(m, i & 1);
        if (hh < hb_b && st.pos[0] <= wmax)   /* warp-uniform: a tile past every row of the warp is skipped */
            af_warp_tile(st, m.qh + qoff, m.ql + qoff, D, ds * sh.dw, sh.dw, window, has_bias,
                         (const int32_t(*)[2])qp, lane, 1, s);
        __syncthreads();   /* the stage is refilled by the next iteration's copies */
        cc = af_settle(pages, cc.ip, cc.r0 + AF_KT, p1, minp, maxp, window);
    }
    af_cp_wait0();
    if (hh >= hb_b) return;
    if (n_split == 1) af_write(&s[0], lane, out, n_q, n_head, h0 + hh, D, ds * sh.dw, sh.dw, row0 + rt * 16);
    else
        af_write_part(&s[0], lane, part_o, part_ml, n_q, n_head, h0 + hh, D, ds * sh.dw, sh.dw, row0 + rt * 16, n_split,
                      (int)blockIdx.z);
}

/* A call's selection by bounds, as sel_gather_kernel reads it: the list of every page and its
 * offsets, the best and counts where the bounds left them, and each KV head's number of
 * candidates (be_attn.sel_from; a head's list is shorter than 2^31 entries); its list goes to
 * out and out_hp. */
typedef struct sel_call {
    const ag_page *all;
    const int64_t *all_hp;
    const int32_t *best, *n_best;
    ag_page *out;
    int64_t *out_hp;
    int32_t k;
    int32_t from[PT_MAX_HEADS];
} sel_call;

/* Every selection of a launch's calls. */
typedef struct sel_calls {
    sel_call c[BE_ATTN_SEQS_MAX];
} sel_calls;

/* A selection by bounds as the list it stands for (ag_sel_at), from the list of every page and the
 * best and counts where the bounds left them: a block a call (blockIdx.x: S.c's entry), the heads
 * one after another (a few hundred entries in all); the offsets first, by one thread. */
__global__ void __launch_bounds__(256) sel_gather_kernel(const __grid_constant__ sel_calls S, int H)
{
    __shared__ int64_t at[PT_MAX_HEADS + 1];
    __shared__ int32_t nb[PT_MAX_HEADS];
    const sel_call &c = S.c[blockIdx.x];
    if (threadIdx.x == 0) {
        int64_t e = 0;
        for (int g = 0; g < H; g++) {
            const int32_t m = c.n_best[g];
            nb[g] = m < 0 ? 0 : m > c.k ? c.k : m;   /* never outside, from the bounds kernels */
            at[g] = e;
            e += nb[g] + (c.all_hp[g + 1] - c.all_hp[g]) - c.from[g];
        }
        at[H] = e;
        for (int g = 0; g <= H; g++) c.out_hp[g] = at[g];
    }
    __syncthreads();
    for (int g = 0; g < H; g++)
        for (int64_t j = threadIdx.x; j < at[g + 1] - at[g]; j += blockDim.x)
            c.out[at[g] + j] = c.all[c.all_hp[g] + ag_sel_at(c.best + (int64_t)g * c.k, nb[g], c.from[g], j)];
}

/* A call's choice of tokens (be_attn.sel_bits), as bits_list_kernel reads it: the list of every
 * page (with the rows not in the cache after each head's pages) and its offsets, the bitmaps, and
 * each head's count of cache pages (the rows after them are attended whole); its list goes to out
 * and out_hp, the masks to masks (entry j of the full list's at j * mask_words). */
typedef struct bits_call {
    const ag_page *all;
    const int64_t *all_hp;
    const uint64_t *bits;
    int64_t words;
    ag_page *out;
    int64_t *out_hp;
    uint64_t *masks;
    int32_t mask_words;   /* a page's mask at most (be_attn.sel_page_tokens) */
    int32_t pages_of[PT_MAX_HEADS];
} bits_call;

typedef struct bits_calls {
    bits_call c[BE_ATTN_SEQS_MAX];
} bits_calls;

/* The mask words an entry of a choice of tokens may need (be_attn.sel_page_tokens). */
static int32_t mask_words_of(const be_attn *a)
{
    const int32_t t = a->sel_page_tokens;
    return t <= 0 || t > 64 * SG_PAGE_WORDS ? SG_PAGE_WORDS : (t + 63) / 64;
}

/* A choice of tokens as the list it stands for: a block a call, the heads one after another, a
 * thread an entry: its mask from the head's bitmap (sg_page_mask), kept where a token is chosen,
 * in order (a block-wide count of the kept before each). */
__global__ void __launch_bounds__(256) bits_list_kernel(const __grid_constant__ bits_calls S, int H)
{
    __shared__ int32_t warp_kept[8];
    __shared__ int64_t at;
    const bits_call &c = S.c[blockIdx.x];
    const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
    if (tid == 0) at = 0;
    __syncthreads();
    for (int g = 0; g < H; g++) {
        const int64_t h0 = c.all_hp[g], len = c.all_hp[g + 1] - h0;
        const uint64_t *bm = c.bits + (int64_t)g * c.words;
        if (tid == 0) c.out_hp[g] = at;
        for (int64_t base = 0; base < len; base += blockDim.x) {
            const int64_t j = base + tid;
            ag_page pg = {};
            int32_t on = 0;
            if (j < len) {
                pg = c.all[h0 + j];
                const int64_t pw = ((int64_t)pg.n + 63) / 64;
                on = j >= c.pages_of[g] ? pg.n
                     : pw > c.mask_words ? pg.n   /* never: a page larger than the caller said */
                                         : sg_page_mask(bm, c.words, pg.pos, pg.n, c.masks + (h0 + j) * c.mask_words, pw);
            }
            const unsigned kept = __ballot_sync(0xffffffffu, on > 0);
            if (lane == 0) warp_kept[wid] = __popc(kept);
            __syncthreads();
            int64_t before = at;
            for (int w = 0; w < wid; w++) before += warp_kept[w];
            before += __popc(kept & ((1u << lane) - 1u));
            if (on > 0) {
                pg.mask_off = on == pg.n ? -1 : (h0 + j) * c.mask_words;
                c.out[before] = pg;
            }
            __syncthreads();
            if (tid == 0)
                for (int w = 0; w < (int)(blockDim.x >> 5); w++) at += warp_kept[w];
            __syncthreads();
        }
    }
    if (tid == 0) c.out_hp[H] = at;
}

/* One call's list as a launch reads it. */
typedef struct call_list {
    pt_call pl;                     /* its descriptors on the device (pt_build) */
    int64_t e;                      /* entries */
    const int64_t *hp;              /* the host's offsets (the call's, rows[] or NULL) */
    int64_t rows[PT_MAX_HEADS + 1]; /* offsets with the rows not in the cache added */
    size_t mask_at;                 /* its first word of the launch's staged masks */
} call_list;

/* The splits a call alone gets (so that a joined launch gives each call its bits): as many blocks
 * in all for `blocks` blocks of one split as the device holds at once, in one wave (ag_call_splits:
 * the grouped kernel's AG_MIN_BLOCKS a multiprocessor for its rows a round, two for the flash
 * kernel's larger blocks, four for the scalar kernel's), at least one page each of the longest
 * head's `most`; KVCHAT_CUDA_ATTN_SPLITS forces a count for the grouped kernels (a test knob:
 * empty splits allowed, up to most + 64). */
static int call_splits(const cuda_impl *ci, int64_t blocks, int flash, int grouped, int64_t most)
{
    const int per_sm = flash ? 2 : grouped ? AG_MIN_BLOCKS(ci->attn_rows ? ci->attn_rows : AG_ROWS) : 4;
    int n_split = ag_call_splits(per_sm, ci->n_sm, blocks, most);
    if (grouped && ci->attn_splits > 0) n_split = (int)(ci->attn_splits < most + 64 ? ci->attn_splits : most + 64);
    return n_split;
}

/* An attention call begins (or a list placed for one): the page copies' and summaries' idle clocks
 * tick, and after the copies' idle sweep the pool gives back what they freed. */
static void begin_call(cuda_impl *ci)
{
    pt_begin_call(&ci->tables, COPY_IDLE);
    sl_tick(&ci->sums);
    if (ci->copies.calls % COPY_IDLE == 0) bp_trim(&ci->blocks);   /* after the idle copies went back */
}

/* Calls a[0 .. n) in one launch: n 1 (any call), or n > 1 calls be_attn_seqs_joined accepts, each
 * a query of the launch reading its own list (cuda_attention_seqs). begun: the calls were counted
 * already (pt_begin_call and the rest), by a joined launch that gave them back. */
static void attend_calls(cuda_impl *ci, const be_attn *a, int n, int begun)
{
    if (ci->failed || a->n_q <= 0) return;
    int D = a->head_dim;
    if (D > ATT_THREADS * MAX_D_PER_THREAD) {
        fail(ci, "head_dim %d is more than the CUDA attention kernel's %d", D, ATT_THREADS * MAX_D_PER_THREAD);
        return;
    }
    if (a->n_head_kv > PT_MAX_HEADS) {
        fail(ci, "internal error: %d KV heads (at most %d)", a->n_head_kv, PT_MAX_HEADS);
        return;
    }
    /* the launch's queries (joined: call i's is query i) and rows not in the cache (call i's row i) */
    const int64_t n_q = n > 1 ? n : a->n_q, kvd = (int64_t)a->n_head_kv * D;
    const int64_t n_cur = a->n_cur <= 0 ? 0 : n > 1 ? n : a->n_cur;
    call_list cl[BE_ATTN_SEQS_MAX];
    /* Rows not in the cache yet (a deferred decode step) become one more page per KV head, after
     * the head's pages (be_attn_rows_list), pointing at their f16 conversion and their positions on
     * the device (both buffers stay put from call to call, so those entries stay as they are). */
    const uint16_t *cur16 = NULL;
    if (n_cur > 0) {
        size_t len = 0;
        for (int i = 0; i < n; i++) len += (size_t)be_attn_rows_len(&a[i]);
        if (grow_dev(ci, (void **)&ci->cur16, &ci->cap_cur16, sizeof(__half) * 2 * (size_t)(n_cur * kvd)) ||
            grow_dev(ci, (void **)&ci->cur_pos, &ci->cap_cur_pos, sizeof(int32_t) * (size_t)n_cur))
            return;
        if (len > ci->cap_rows_list) {   /* with room: a decode step's list grows by a page a head now and then */
            size_t cap = len + len / 4 + 64;
            be_kv_page *nl = (be_kv_page *)realloc(ci->rows_list, sizeof *nl * cap);
            if (!nl) {
                fail(ci, "out of memory");
                return;
            }
            ci->rows_list = nl;
            ci->cap_rows_list = cap;
        }
        cur16 = (const uint16_t *)ci->cur16;
    }
    /* each list's descriptors, kept on the device under its call's name: only what changed is
     * built and queued (kernels/page_tables.c), then sent with the pages' new rows in one batch;
     * each call counts as one for the copies' idle sweeps, as it would alone */
    const pt_direct rows = { cur16, sizeof(__half) * 2 * (size_t)(n_cur * kvd) };
    size_t at = 0, w = 0;
    int aligned = 1, has_bias = 0;
    for (int i = 0; i < n; i++) {
        if (!begun) begin_call(ci);
        /* a fork's first call: its list starts as its source's (sent by the build below), so that
         * only each head's last pages are read and sent */
        if (a[i].from_table) {
            int crc = pt_clone(&ci->tables, a[i].table, a[i].from_table);
            if (crc != PT_OK) {
                tables_failed(ci, crc);
                return;
            }
        }
        call_list *c = &cl[i];
        const be_kv_page *list = a[i].pages;
        c->hp = a[i].head_pages;
        c->e = a[i].n_pages;
        if (n_cur > 0) {   /* call i's rows: keys then values, each every call's in order (cur16's layout) */
            /* only the entries pt_build will read: a decode step's list that only grew, each head's
             * last pages and rows (copying every page was most of a long context's host work) */
            int64_t from[PT_MAX_HEADS];
            c->e = be_attn_rows_heads(&a[i], c->rows);
            int tail = pt_reads_from(&ci->tables, a[i].table, a[i].shape, c->rows, a->n_head_kv, from);
            be_attn_rows_fill(&a[i], cur16 + i * kvd, cur16 + (n_cur + i) * kvd, ci->cur_pos + i, ci->rows_list + at,
                              c->rows, tail ? from : NULL);
            list = ci->rows_list + at;
            c->hp = c->rows;
            at += (size_t)c->e;
        }
        int rc = pt_build(&ci->tables, a[i].table, a[i].shape, list, c->e, c->hp, a->n_head_kv, cur16 ? &rows : NULL,
                          &c->pl);
        if (rc != PT_OK) {
            tables_failed(ci, rc);
            return;
        }
        aligned &= c->pl.aligned;
        has_bias |= c->pl.has_bias;
        c->mask_at = w;
        if (n > 1 && c->pl.n_words) {   /* the next build reuses the words: kept one after another */
            if (w + c->pl.n_words > ci->cap_masks_all) {
                size_t cap = 2 * (w + c->pl.n_words);
                uint64_t *nm = (uint64_t *)realloc(ci->masks_all, sizeof *nm * cap);
                if (!nm) {
                    fail(ci, "out of memory");
                    lose_batch(ci);
                    return;
                }
                ci->masks_all = nm;
                ci->cap_masks_all = cap;
            }
            memcpy(ci->masks_all + w, c->pl.masks, sizeof(uint64_t) * c->pl.n_words);
        }
        w += c->pl.n_words;
    }
    if (n > 1 && !aligned) {   /* the grouped kernel cannot read some list: a launch a call */
        for (int i = 0; i < n; i++) attend_calls(ci, &a[i], 1, 1);
        return;
    }
    if (n_cur > 0 && ub_add(&ci->batch, ci->cur_pos, a->cur_pos, sizeof(int32_t) * (size_t)n_cur)) {
        fail(ci, "out of memory");
        lose_batch(ci);
        return;
    }
    const uint64_t *masks = n > 1 ? ci->masks_all : cl[0].pl.masks;
    size_t nq = (size_t)n_q * (size_t)a->n_head * (size_t)D, ncur = (size_t)(n_cur * kvd);
    int expand = n_cur > 0;
    int ck_bound = expand && bound(ci, a->cur_k, sizeof(float) * ncur);
    int cv_bound = expand && bound(ci, a->cur_v, sizeof(float) * ncur);
    /* a deferred step's own rows in twins (the forward pass's case): rounded to f16 by the batch's
     * scatter launch (staged rows below, once staged; KVCHAT_CUDA_LAUNCHES=apart: a launch each) */
    const int halves_now = ck_bound && cv_bound && !ci->launch_apart;
    const float *hk = halves_now ? (const float *)am_dev_in(&ci->act, a->cur_k, sizeof(float) * ncur) : NULL;
    const float *hv = halves_now ? (const float *)am_dev_in(&ci->act, a->cur_v, sizeof(float) * ncur) : NULL;
    if (send_batch_halves(ci, hk, hv, ci->cur16, halves_now ? (int64_t)ncur : 0)) return;
    /* the grouped kernels read rows 16 bytes at a time */
    int grouped = !ci->attn_scalar && ag_supported(D) && aligned;
    int q_bound = bound(ci, a->q, sizeof(float) * nq);
    /* a selection by bounds: its best and counts, where the bounds left them or from the host */
    size_t sel_staged = 0, sel_ib[BE_ATTN_SEQS_MAX], sel_cb[BE_ATTN_SEQS_MAX];   /* best's bytes, counts' */
    size_t sel_bb[BE_ATTN_SEQS_MAX];   /* a choice of tokens' bitmaps' bytes */
    int sel_bound[BE_ATTN_SEQS_MAX], bits_bound[BE_ATTN_SEQS_MAX];
    for (int i = 0; i < n; i++) {
        const be_attn *c = &a[i];
        const size_t ib = sel_ib[i] = c->sel_best ? sizeof(int32_t) * (size_t)(c->n_head_kv * c->sel_k) : 0;
        const size_t cb = sel_cb[i] = c->sel_best ? sizeof(int32_t) * (size_t)c->n_head_kv : 0;
        sel_bound[i] = c->sel_best && bound(ci, c->sel_best, ib) && bound(ci, c->sel_n_best, cb);
        if (c->sel_best && !sel_bound[i] && (bound(ci, c->sel_best, ib) || bound(ci, c->sel_n_best, cb))) {
            fail(ci, "internal error: a selection's best and counts bound apart");
            return;
        }
        if (c->sel_best && !cl[i].hp) {
            fail(ci, "internal error: a selection by bounds without per-head lists");
            return;
        }
        if (c->sel_best && !sel_bound[i]) sel_staged += stage_size(ib) + stage_size(cb);
        const size_t bb = sel_bb[i] = c->sel_bits ? sizeof(uint64_t) * (size_t)c->n_head_kv * (size_t)c->sel_words : 0;
        bits_bound[i] = c->sel_bits && bound(ci, c->sel_bits, bb);
        if (c->sel_bits && (!cl[i].hp || c->sel_best)) {
            fail(ci, "internal error: a choice of tokens without per-head lists, or with a selection");
            return;
        }
        if (c->sel_bits && !bits_bound[i]) sel_staged += stage_size(bb);
    }
    /* the positions: kept on the device while they stay the same (every layer of a step has the
     * same, and qk_rope sent them already), taken before anything is staged below (sending may
     * wait and free the arena); KVCHAT_CUDA_LAUNCHES=apart: staged each call */
    const int32_t *d_qpos = NULL;
    if (!ci->launch_apart && !(d_qpos = (const int32_t *)const_get(ci, a->q_pos, sizeof(int32_t) * (size_t)n_q)))
        return;
    if (stage_reserve(ci, stage_size(sizeof(uint64_t) * w) +
                              (d_qpos ? 0 : stage_size(sizeof(int32_t) * (size_t)n_q)) +
                              (q_bound ? 0 : stage_size(sizeof(float) * nq)) +
                              (expand && !ck_bound ? stage_size(sizeof(float) * ncur) : 0) +
                              (expand && !cv_bound ? stage_size(sizeof(float) * ncur) : 0) + sel_staged))
        return;
    if (expand && !halves_now) {
        const float *dk = ck_bound ? (const float *)am_dev_in(&ci->act, a->cur_k, sizeof(float) * ncur)
                                   : (const float *)stage(ci, a->cur_k, sizeof(float) * ncur);
        const float *dv = cv_bound ? (const float *)am_dev_in(&ci->act, a->cur_v, sizeof(float) * ncur)
                                   : (const float *)stage(ci, a->cur_v, sizeof(float) * ncur);
        if (!dk || !dv) return;
        /* the batch went above: the scatter kernel runs for the conversion alone */
        const int64_t nc = (int64_t)ncur;
        if (ci->launch_apart ? to_half(ci, dk, ci->cur16, nc) || to_half(ci, dv, ci->cur16 + nc, nc)
                             : send_batch_halves(ci, dk, dv, ci->cur16, nc))
            return;
    }
    const uint64_t *d_masks = w ? (const uint64_t *)stage(ci, masks, sizeof(uint64_t) * w) : NULL;
    if (!d_qpos) d_qpos = (const int32_t *)stage(ci, a->q_pos, sizeof(int32_t) * (size_t)n_q);
    const float *d_q = q_bound ? (const float *)am_dev_in(&ci->act, a->q, sizeof(float) * nq)
                               : (const float *)stage(ci, a->q, sizeof(float) * nq);
    if ((w && !d_masks) || !d_qpos || !d_q) return;
    /* A selection by bounds: its list built on the device from the list of every page, with no
     * wait for the bounds; the host knows each head's length only as a bound, which sizes the
     * splits (some of a shorter head's may be empty). Each call's goes to its own part of the
     * buffers. */
    int64_t most[BE_ATTN_SEQS_MAX], ub[BE_ATTN_SEQS_MAX], ub_all = 0;
    size_t bits_words = 0;
    int any_sel = 0;
    for (int i = 0; i < n; i++) {
        const call_list *c = &cl[i];
        most[i] = c->e;
        ub[i] = 0;
        if (c->hp) {
            most[i] = 0;
            for (int g = 0; g < a->n_head_kv; g++)
                if (c->hp[g + 1] - c->hp[g] > most[i]) most[i] = c->hp[g + 1] - c->hp[g];
        }
        if (a[i].sel_bits) {   /* at most the whole list, each head at most its own */
            any_sel = 1;
            ub[i] = c->e;
            ub_all += ub[i];
            bits_words += (size_t)c->e * (size_t)mask_words_of(&a[i]);
            continue;
        }
        if (!a[i].sel_best) continue;
        any_sel = 1;
        most[i] = 0;
        for (int g = 0; g < a->n_head_kv; g++) {
            const int64_t len = c->hp[g + 1] - c->hp[g], from = a[i].sel_from[g];
            if (from < 0 || from > len || from > INT32_MAX) {
                fail(ci, "internal error: a selection of %lld candidates in a list of %lld", (long long)from,
                     (long long)len);
                return;
            }
            const int64_t at_most = (from < a[i].sel_k ? from : a[i].sel_k) + len - from;
            ub[i] += at_most;
            if (at_most > most[i]) most[i] = at_most;
        }
        ub_all += ub[i];
    }
    if (any_sel && (grow_dev(ci, (void **)&ci->sel_pages, &ci->cap_sel_pages,
                             sizeof(ag_page) * (size_t)(ub_all > 0 ? ub_all : 1)) ||
                       grow_dev(ci, (void **)&ci->sel_hp, &ci->cap_sel_hp,
                                sizeof(int64_t) * (PT_MAX_HEADS + 1) * (size_t)n) ||
                       (bits_words &&
                        grow_dev(ci, (void **)&ci->sel_masks, &ci->cap_sel_masks, sizeof(uint64_t) * bits_words))))
        return;
    ag_lists L;
    memset(&L, 0, sizeof L);
    L.n = n;
    int64_t sel_at = 0;
    size_t bits_at = 0;
    sel_calls sc;
    bits_calls bc;
    int n_sc = 0, n_bc = 0;
    for (int i = 0; i < n; i++) {
        const be_attn *c = &a[i];
        ag_list *l = &L.l[i];
        l->pages = cl[i].pl.pages;
        l->head_pages = cl[i].pl.head_pages;
        l->masks = d_masks ? d_masks + cl[i].mask_at : NULL;
        l->n_pages = cl[i].e;
        if (c->sel_bits) {
            bits_call *g = &bc.c[n_bc++];
            g->bits = bits_bound[i] ? (const uint64_t *)am_dev_in(&ci->act, c->sel_bits, sel_bb[i])
                                    : (const uint64_t *)stage(ci, c->sel_bits, sel_bb[i]);
            if (!g->bits) return;
            g->words = c->sel_words;
            for (int h = 0; h < c->n_head_kv; h++)
                g->pages_of[h] = (int32_t)(c->head_pages ? c->head_pages[h + 1] - c->head_pages[h] : c->n_pages);
            g->all = l->pages;
            g->all_hp = l->head_pages;
            g->out = ci->sel_pages + sel_at;
            g->out_hp = ci->sel_hp + (PT_MAX_HEADS + 1) * (size_t)i;
            g->masks = ci->sel_masks + bits_at;
            g->mask_words = mask_words_of(c);
            l->pages = g->out;
            l->head_pages = g->out_hp;
            l->masks = g->masks;
            l->n_pages = ub[i];
            sel_at += ub[i];
            bits_at += (size_t)cl[i].e * (size_t)g->mask_words;
            continue;
        }
        if (!c->sel_best) continue;
        sel_call *g = &sc.c[n_sc++];
        for (int h = 0; h < c->n_head_kv; h++) g->from[h] = (int32_t)c->sel_from[h];
        const size_t ib = sel_ib[i], cb = sel_cb[i];
        g->best = sel_bound[i] ? (const int32_t *)am_dev_in(&ci->act, c->sel_best, ib)
                               : (const int32_t *)stage(ci, c->sel_best, ib);
        g->n_best = sel_bound[i] ? (const int32_t *)am_dev_in(&ci->act, c->sel_n_best, cb)
                                 : (const int32_t *)stage(ci, c->sel_n_best, cb);
        if (!g->best || !g->n_best) return;
        g->all = l->pages;
        g->all_hp = l->head_pages;
        g->k = c->sel_k;
        g->out = ci->sel_pages + sel_at;
        g->out_hp = ci->sel_hp + (PT_MAX_HEADS + 1) * (size_t)i;
        l->pages = g->out;
        l->head_pages = g->out_hp;
        l->n_pages = ub[i];
        sel_at += ub[i];
    }
    if (n_sc > 0) {   /* every call's selection built in one launch, a block each */
        sel_gather_kernel<<<(unsigned)n_sc, 256, 0, ci->stream>>>(sc, a->n_head_kv);
        if (ck(ci, cudaGetLastError(), "selection gather kernel")) return;
    }
    if (n_bc > 0) {   /* every call's choice of tokens as its list, in one launch, a block each */
        bits_list_kernel<<<(unsigned)n_bc, 256, 0, ci->stream>>>(bc, a->n_head_kv);
        if (ck(ci, cudaGetLastError(), "choice of tokens kernel")) return;
    }
    /* the kernel: tensor-core prefill (the default for chunks; its shared memory allowed once), the
     * grouped kernel, or the scalar one (joined calls: grouped, cuda_attention_seqs) */
    const int group = a->n_head / a->n_head_kv, nhb = ag_head_batches(group);
    const af_shape fsh = af_shape_of(D, group);
    const size_t fsmem = af_smem_bytes(D, fsh);
    int flash = grouped && ci->attn_flash && n_q >= AF_MIN_Q && af_supported(D) && n == 1;
    if (flash && fsmem > ci->flash_smem_set) {
        int allowed = 0;
        cudaDeviceGetAttribute(&allowed, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
        if ((size_t)allowed < fsmem ||
            cudaFuncSetAttribute(attn_flash_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fsmem) !=
                cudaSuccess) {
            cudaGetLastError();   /* not sticky: the grouped kernel runs instead, said once */
            if (!ci->flash_refused)
                fprintf(stderr, "kvchat: the flash attention kernel needs %zu KiB of shared memory a block for head "
                                "dimension %d, this device allows %d KiB: prefill attention runs on the grouped "
                                "kernel\n",
                        fsmem >> 10, D, allowed >> 10);
            ci->flash_refused = 1;
            flash = 0;
        } else {
            ci->flash_smem_set = fsmem;
        }
    }
    /* splits: each call's own, as its query (or queries) alone would make them */
    const int64_t q_one = n > 1 ? 1 : a->n_q, f_rows = (a->n_q + fsh.rt * 16 - 1) / (fsh.rt * 16);
    const int64_t blocks = flash ? f_rows * a->n_head_kv * nhb : grouped ? (int64_t)a->n_head_kv * nhb * q_one
                                                                          : (int64_t)a->n_head * q_one;
    for (int i = 0; i < n; i++) {
        L.l[i].n_split = call_splits(ci, blocks, flash, grouped, most[i]);
        if (L.l[i].n_split > L.stride) L.stride = L.l[i].n_split;
    }
    const int n_split = L.l[0].n_split;   /* one call's */
    size_t n_part = (size_t)n_q * (size_t)a->n_head * (size_t)L.stride;
    int out_bound = bound(ci, a->out, sizeof(float) * nq);
    if (!(flash && n_split == 1) &&
        (grow_dev(ci, (void **)&ci->part_o, &ci->cap_po, sizeof(float) * n_part * (size_t)D) ||
         grow_dev(ci, (void **)&ci->part_ml, &ci->cap_pml, sizeof(float) * n_part * 2)))
        return;
    if (!out_bound && (grow_dev(ci, (void **)&ci->out, &ci->cap_out, sizeof(float) * nq) ||
                       grow_host(ci, (void **)&ci->h_out, &ci->cap_h_out, sizeof(float) * nq)))
        return;
    float *d_out = out_bound ? (float *)am_dev_out(&ci->act, a->out, sizeof(float) * nq) : ci->out;
    cudaStream_t s = ci->stream;
    const dim3 per_row((unsigned)a->n_head, (unsigned)n_q);
    const unsigned combine_threads = D < 256 ? (unsigned)D : 256u;
    const ag_list *l0 = &L.l[0];
    if (flash) {
        dim3 grid((unsigned)f_rows, (unsigned)(a->n_head_kv * nhb), (unsigned)n_split);
        attn_flash_kernel<<<grid, fsh.warps * 32, fsmem, s>>>(d_q, d_qpos, a->n_q, l0->pages, l0->n_pages,
                                                               l0->head_pages, l0->masks, a->n_head, group, D,
                                                               a->window, has_bias, n_split, d_out, ci->part_o,
                                                               ci->part_ml);
        if (ck(ci, cudaGetLastError(), "flash attention kernel")) return;
        ci->flash_calls++;
    } else if (grouped) {
        dim3 grid((unsigned)(a->n_head_kv * nhb), (unsigned)n_q, (unsigned)L.stride);
#define LISTS(R)                                                                                                \
    attn_group_lists_kernel<R><<<grid, AG_THREADS, 0, s>>>(d_q, d_qpos, L, a->n_head, group, D, a->window, 0u,      \
                                                           ci->part_o, ci->part_ml)
#define ONE_LIST(R)                                                                                             \
    attn_group_kernel<R><<<grid, AG_THREADS, 0, s>>>(d_q, d_qpos, l0->pages, l0->n_pages, l0->head_pages, l0->masks, \
                                                     a->n_head, group, D, a->window, n_split, 0u, ci->part_o,      \
                                                     ci->part_ml)
        /* rows a slot fetches a round: KVCHAT_CUDA_ATTN_ROWS, else AG_ROWS */
        const int rows = ci->attn_rows ? ci->attn_rows : AG_ROWS;
        if (n > 1) {
            if (rows == 2) LISTS(2);
            else if (rows == 4) LISTS(4);
            else LISTS(8);
        } else {
            if (rows == 2) ONE_LIST(2);
            else if (rows == 4) ONE_LIST(4);
            else ONE_LIST(8);
        }
#undef LISTS
#undef ONE_LIST
        if (ck(ci, cudaGetLastError(), "attention kernel")) return;
    } else {
        dim3 grid((unsigned)a->n_head, (unsigned)a->n_q, (unsigned)n_split);
        size_t shmem = sizeof(float) * ((size_t)D + ATT_THREADS + ATT_THREADS / 32);
        attn_kernel<<<grid, ATT_THREADS, shmem, s>>>(d_q, d_qpos, l0->pages, l0->n_pages, l0->head_pages, l0->masks,
                                                     a->n_head, group, D, a->window, n_split, ci->part_o, ci->part_ml);
        if (ck(ci, cudaGetLastError(), "attention kernel")) return;
    }
    if (!(flash && n_split == 1)) {   /* the flash kernel's one split wrote the rows itself */
        /* into a twin, decode-sized: with the output product's input codes (combine_threads is D
         * or 256, a multiple of 32 when D is) */
        float *qd = NULL, *qs = NULL;
        int8_t *q = out_bound && D % DD_QBLOCK == 0 ? codes_for(ci, (int64_t)nq, n_q, &qd, &qs) : NULL;
        if (ci->failed) return;
        attn_combine<<<per_row, combine_threads, 0, s>>>(ci->part_o, ci->part_ml, L, a->n_head, D, d_out, q, qd, qs);
        if (ck(ci, cudaGetLastError(), "attention combine kernel")) return;
        if (q) codes_written(ci, d_out, (int64_t)nq);
    }
    if (out_bound) return;
    ci->bytes_down += sizeof(float) * nq;
    if (ck(ci, cudaMemcpyAsync(ci->h_out, ci->out, sizeof(float) * nq, cudaMemcpyDeviceToHost, s), "download") ||
        sync_stream(ci, "attention"))
        return;
    memcpy(a->out, ci->h_out, sizeof(float) * nq);
}

void cuda_attention(be_backend *b, const be_attn *a)
{
    cuda_impl *ci = impl_of(b);
    seg_op(ci, a->n_q <= SEG_ROWS ? SEG_START : SEG_EAGER);
    attend_calls(ci, a, 1, 0);
}

/* A batch's calls in one launch where they are laid out for it and the grouped kernel reads them
 * (KVCHAT_CUDA_LAUNCHES=apart, the scalar kernel: a launch a call, as before). */
void cuda_attention_seqs(be_backend *b, const be_attn *a, int n)
{
    cuda_impl *ci = impl_of(b);
    seg_op(ci, SEG_START);   /* a batch's decode step: a query a sequence */
    if (n <= 0) return;
    if (n == 1 || ci->launch_apart || ci->attn_scalar || !ag_supported(a->head_dim) || !be_attn_seqs_joined(a, n)) {
        for (int i = 0; i < n; i++) attend_calls(ci, &a[i], 1, 0);
        return;
    }
    attend_calls(ci, a, n, 0);
}

/* Lists the next attention calls will read, put on the device now (be_ops.place_pages): each list's
 * pages' copies brought up to date and its descriptors kept under its name and shape, as the call
 * would, and nothing waited for. Each counts as a call for the idle sweeps, as the call would. Memory
 * found short stops the placing without a failure recorded: the call that reads the pages meets it
 * and says so. */
void cuda_place_pages(be_backend *b, const be_attn *a, int n)
{
    cuda_impl *ci = impl_of(b);
    seg_op(ci, SEG_EAGER);
    for (int i = 0; i < n && !ci->failed; i++) {
        begin_call(ci);
        pt_call pl;
        const int rc = a[i].from_table ? pt_clone(&ci->tables, a[i].table, a[i].from_table) : PT_OK;   /* a fork's */
        if (rc != PT_OK) {
            tables_failed(ci, rc);
            return;
        }
        if (policy_list(ci, a[i].table, a[i].shape, a[i].pages, a[i].n_pages, a[i].head_pages, a[i].n_head_kv, &pl))
            return;
    }
}
