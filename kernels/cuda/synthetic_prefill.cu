/* synthetic_prefill.cu - time to the first token of the synthetic model (kernels/synthetic.h), full
 * attention against TAKE, for `kvchat bench --synthetic`.
 *
 * One sequence of ctx random tokens is prefilled in chunks of Z tokens (the engine's default batch and
 * TAKE chunk, 512): per chunk and layer RMSNorm, the QKV product (cuBLAS, Z rows), RoPE with the
 * chunk's K/V page writes, flash attention of the chunk's queries over the layer's page list
 * (tensor cores; causal by position, no score matrix in memory), the output product, the FFN; after
 * the last chunk the last row's logits and the greedy first token. Under full attention every chunk
 * attends to every page before it. Under TAKE (engine/policy/take.c), the last p = 32 prompt tokens
 * (the question) run with every chunk as probe rows that write no K/V; after each chunk, per layer and
 * KV head, the cached pages are scored by the probe's softmax attention (its query smoothed across
 * chunks by an EMA, alpha 0.5) and only the best budget k = 1024 tokens survive (2k in the first half
 * of the layers, TAKE's delayed eviction), so a chunk attends to at most k + Z tokens. This benchmark
 * evicts whole pages of 32 tokens where the engine evicts tokens (and skips the engine's max-pooling
 * along the sequence, which is narrower than a page): the work per chunk is the same. */
#include <math.h>
#include <stdlib.h>

#include "kernels/cuda/synthetic_impl.cuh"

#define PF_ROWS 32          /* queries per attention block: 2 tiles of 16, x the group's 4 heads = 8 warps */
#define TAKE_PROBE 32
#define TAKE_BUDGET 1024
#define TAKE_ALPHA 0.5f
#define TAKE_CAP 128        /* pages in a TAKE list: 2k/P kept + Z/P of the chunk, with room */

/* ---------------------------------------------------------------- kernels */

/* x[r] = the embedding row of tok[r] (f32) */
__global__ void k_embed(const __half *emb, int d, const int *tok, float *x)
{
    int r = blockIdx.x;
    for (int i = threadIdx.x; i < d; i += blockDim.x) x[(size_t)r * d + i] = __half2float(emb[(size_t)tok[r] * d + i]);
}

/* RoPE of every row's query heads into q (f16, scaled by 1/sqrt(HD) for the scores) and, for the
 * first n_write rows, of its key heads into the pages with their values. grid (n_head + n_kv, rows),
 * block HD/2. */
__global__ void k_rope_prefill(const float *qkv, __half *q, __half *K, __half *V, const int *pos, const int *ptab,
                               int n_head, int n_kv, int n_write, float base, float scale)
{
    int h = blockIdx.x, r = blockIdx.y, i = threadIdx.x, hd = SY_HD;
    int p = pos[r];
    float theta = (float)p * powf(base, -2.0f * (float)i / (float)hd);
    float c, s;
    sincosf(theta, &s, &c);
    const float *row = qkv + (size_t)r * (n_head + 2 * n_kv) * hd;
    if (h < n_head) {
        float x0 = row[h * hd + 2 * i], x1 = row[h * hd + 2 * i + 1];
        __half2 o = __floats2half2_rn((x0 * c - x1 * s) * scale, (x0 * s + x1 * c) * scale);
        *(__half2 *)(q + ((size_t)r * n_head + h) * hd + 2 * i) = o;
        return;
    }
    if (r >= n_write) return;
    int kv = h - n_head;
    float x0 = row[(n_head + kv) * hd + 2 * i], x1 = row[(n_head + kv) * hd + 2 * i + 1];
    size_t at = (((size_t)ptab[p / SY_P] * n_kv + kv) * SY_P + p % SY_P) * hd + 2 * i;
    *(__half2 *)(K + at) = __floats2half2_rn(x0 * c - x1 * s, x0 * s + x1 * c);
    *(__half2 *)(V + at) = __floats2half2_rn(row[(n_head + n_kv + kv) * hd + 2 * i], row[(n_head + n_kv + kv) * hd + 2 * i + 1]);
}

/* Flash attention of a chunk's rows over a page list, on the tensor cores. Block: 32 query rows of one
 * KV head; warp w takes query head (w % 4) of the group and the 16 rows of tile w / 4; the block's
 * warps share each K/V page, streamed through TC_STAGES of swizzled shared memory. Per page: S = Q K^T
 * (m16n8k16, 4 tiles of 8 keys), the online softmax along each row, O += P V with P kept in registers
 * (the score fragments are the next product's A operand). A key is seen when its position is at most
 * the row's and below kv_len (the rows written so far). out: O / l, f16 [row][head][dim].
 * grid (ceil(rows / 32), n_kv), block 256. */
__global__ void __launch_bounds__(256) k_attn_prefill(const __half *q, const int *qpos, int rows, const __half *K,
                                                      const __half *V, const int *ptab, const int *list,
                                                      const int *nlist, int cap, int kv_len, int n_kv, __half *out)
{
    extern __shared__ __align__(128) unsigned char smem[];
    __half *stages = (__half *)smem;
    int kv = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    int n_head = n_kv * SY_G, head = kv * SY_G + (warp & 3);
    int r0 = blockIdx.x * PF_ROWS + (warp >> 2) * 16;
    int ra = r0 + g, rb = r0 + g + 8;
    int pa = ra < rows ? qpos[ra] : -1, pb = rb < rows ? qpos[rb] : -1;
    const int *lst = list + (size_t)kv * cap;
    int n = nlist[kv];
    /* Q as the A operand: rows g, g+8; dims 2t.. and 2t+8.. of each 16 */
    unsigned qa[8][4];
#pragma unroll
    for (int kk = 0; kk < 8; kk++) {
        int d = kk * 16 + 2 * t;
        const __half *qa_row = q + ((size_t)ra * n_head + head) * SY_HD, *qb_row = q + ((size_t)rb * n_head + head) * SY_HD;
        qa[kk][0] = ra < rows ? *(const unsigned *)(qa_row + d) : 0u;
        qa[kk][1] = rb < rows ? *(const unsigned *)(qb_row + d) : 0u;
        qa[kk][2] = ra < rows ? *(const unsigned *)(qa_row + d + 8) : 0u;
        qa[kk][3] = rb < rows ? *(const unsigned *)(qb_row + d + 8) : 0u;
    }
    float o[16][4];
#pragma unroll
    for (int nt = 0; nt < 16; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float m_run[2] = { -INFINITY, -INFINITY }, l_run[2] = { 0.0f, 0.0f };   /* rows g, g+8 */
    /* each thread copies 4 of the page's 1024 16-byte chunks (K, then V) */
#define PF_LOAD(slot, idx)                                                                                         \
    do {                                                                                                           \
        size_t base_ = ((size_t)ptab[lst[idx]] * n_kv + kv) * TC_PAGE_HALVES;                                      \
        __half *stg_ = stages + (slot) * 2 * TC_PAGE_HALVES;                                                       \
        for (int c_ = tid; c_ < 2 * (TC_PAGE_HALVES / 8); c_ += 256) {                                             \
            int v_ = c_ >= TC_PAGE_HALVES / 8, cc_ = c_ - v_ * (TC_PAGE_HALVES / 8), row_ = cc_ >> 4, ch_ = cc_ & 15; \
            cp_async16(stg_ + v_ * TC_PAGE_HALVES + swz(row_, ch_), (v_ ? V : K) + base_ + (size_t)cc_ * 8);       \
        }                                                                                                          \
    } while (0)
#pragma unroll
    for (int s = 0; s < TC_STAGES - 1; s++) {
        if (s < n) PF_LOAD(s, s);
        cp_commit();
    }
    for (int i = 0; i < n; i++) {
        if (i + TC_STAGES - 1 < n) PF_LOAD((i + TC_STAGES - 1) % TC_STAGES, i + TC_STAGES - 1);
        cp_commit();
        cp_wait<TC_STAGES - 1>();
        __syncthreads();
        const __half *kp = stages + (i % TC_STAGES) * 2 * TC_PAGE_HALVES, *vp = kp + TC_PAGE_HALVES;
        int kpos0 = lst[i] * SY_P;
        /* warp-uniform: a page none of the warp's rows can see is skipped */
        if (kpos0 < kv_len && __any_sync(0xffffffffu, kpos0 <= max(pa, pb))) {
            float sc[4][4];
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < 8; kk += 2) {
                    unsigned b[4];   /* keys 8nt.., dims of k-steps kk and kk+1 */
                    ldsm_x4(b, kp + swz(nt * 8 + (lane & 7), kk * 2 + (lane >> 3)));
                    mma16816(sc[nt], qa[kk], b[0], b[1]);
                    mma16816(sc[nt], qa[kk + 1], b[2], b[3]);
                }
            }
            float mx[2] = { -INFINITY, -INFINITY };
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int kpos = kpos0 + nt * 8 + 2 * t + (e & 1), qp = e < 2 ? pa : pb;
                    if (kpos > qp || kpos >= kv_len) sc[nt][e] = -INFINITY;
                    mx[e >> 1] = fmaxf(mx[e >> 1], sc[nt][e]);
                }
            float f[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
                float mn = fmaxf(m_run[h], mx[h]);
                f[h] = mn == -INFINITY ? 1.0f : __expf(m_run[h] - mn);
                m_run[h] = mn;
            }
            float sum[2] = { 0.0f, 0.0f };
            unsigned pa_[2][4];   /* P as the A operand of O += P V: k-steps of 16 keys */
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                float p[4];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    p[e] = sc[nt][e] == -INFINITY ? 0.0f : __expf(sc[nt][e] - m_run[e >> 1]);
                    sum[e >> 1] += p[e];
                }
                pa_[nt >> 1][(nt & 1) * 2 + 0] = pack_half2(p[0], p[1]);
                pa_[nt >> 1][(nt & 1) * 2 + 1] = pack_half2(p[2], p[3]);
            }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 1);
                sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 2);
                l_run[h] = l_run[h] * f[h] + sum[h];
            }
#pragma unroll
            for (int nt = 0; nt < 16; nt++) o[nt][0] *= f[0], o[nt][1] *= f[0], o[nt][2] *= f[1], o[nt][3] *= f[1];
#pragma unroll
            for (int j = 0; j < 2; j++) {
                /* A fragment order for m16n8k16: (row g, k 2t), (row g+8, k 2t), (row g, k 2t+8), (row g+8, k 2t+8) */
                unsigned a[4] = { pa_[j][0], pa_[j][1], pa_[j][2], pa_[j][3] };
#pragma unroll
                for (int nt = 0; nt < 16; nt += 2) {
                    unsigned b[4];   /* keys 16j.., dims 8nt.. and 8(nt+1).. */
                    int row = j * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, ch = nt + (lane >> 4);
                    ldsm_x4_t(b, vp + swz(row, ch));
                    mma16816(o[nt], a, b[0], b[1]);
                    mma16816(o[nt + 1], a, b[2], b[3]);
                }
            }
        }
        __syncthreads();   /* the stage is overwritten by a later iteration's copies */
    }
    cp_wait<0>();
#undef PF_LOAD
    float inv[2] = { l_run[0] > 0 ? 1.0f / l_run[0] : 0.0f, l_run[1] > 0 ? 1.0f / l_run[1] : 0.0f };
#pragma unroll
    for (int nt = 0; nt < 16; nt++) {
        int d = nt * 8 + 2 * t;
        if (ra < rows) *(__half2 *)(out + ((size_t)ra * n_head + head) * SY_HD + d) = __floats2half2_rn(o[nt][0] * inv[0], o[nt][1] * inv[0]);
        if (rb < rows) *(__half2 *)(out + ((size_t)rb * n_head + head) * SY_HD + d) = __floats2half2_rn(o[nt][2] * inv[1], o[nt][3] * inv[1]);
    }
}

/* TAKE: the probe's query smoothed across chunks (ema = q on the first chunk, else alpha q + (1 - alpha)
 * ema), f32 [probe][n_head][HD]; q rows from `first`. */
__global__ void k_take_ema(const __half *q, int first, int n_elem, float *ema, int fresh)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n_elem; i += gridDim.x * blockDim.x) {
        float v = __half2float(q[(size_t)first * (n_elem / TAKE_PROBE) + i]);
        ema[i] = fresh ? v : TAKE_ALPHA * v + (1.0f - TAKE_ALPHA) * ema[i];
    }
}

/* TAKE: the smoothed probe's logits against every key of the list; thread (probe row, head of the
 * group), block = one listed page. logit[kv][row*G + g][i*P + key]. grid (n, n_kv), block 128. */
__global__ void __launch_bounds__(128) k_take_logits(const float *ema, const __half *K, const int *ptab, const int *list,
                                                     const int *nlist, int cap, int kv_len, int n_kv, float *logit,
                                                     int lstride)
{
    __shared__ __align__(16) __half kp[SY_P * SY_HD];
    int i = blockIdx.x, kv = blockIdx.y, tid = threadIdx.x;
    if (i >= nlist[kv]) return;
    int lp = list[(size_t)kv * cap + i];
    const __half *src = K + ((size_t)ptab[lp] * n_kv + kv) * SY_P * SY_HD;
    for (int c = tid; c < SY_P * SY_HD / 8; c += 128) ((uint4 *)kp)[c] = ((const uint4 *)src)[c];
    __syncthreads();
    int r = tid / SY_G, gh = tid % SY_G, n_head = n_kv * SY_G;
    const float *qv = ema + ((size_t)r * n_head + kv * SY_G + gh) * SY_HD;   /* already scaled by 1/sqrt(HD) */
    float qr[SY_HD];
#pragma unroll
    for (int d = 0; d < SY_HD; d++) qr[d] = qv[d];
    float *out = logit + ((size_t)kv * TAKE_PROBE * SY_G + tid) * lstride + (size_t)i * SY_P;
    for (int k = 0; k < SY_P; k++) {
        float s = 0;
        const __half2 *kr = (const __half2 *)(kp + k * SY_HD);
#pragma unroll
        for (int d = 0; d < SY_HD / 2; d++) {
            float2 f = __half22float2(kr[d]);
            s += qr[2 * d] * f.x + qr[2 * d + 1] * f.y;
        }
        out[k] = lp * SY_P + k < kv_len ? s : -INFINITY;
    }
}

/* TAKE: each page's share of the probe's attention, summed over probe rows and the group's heads.
 * Block (KV head, probe row and head): the softmax over every listed key (block max and sum), then
 * its mass per page added into score[kv][page] (zeroed before). grid (n_kv, probe x G), block 256. */
__global__ void __launch_bounds__(256) k_take_mass(const float *logit, const int *nlist, int n_kv, int lstride, float *score)
{
    __shared__ float red[32];
    int kv = blockIdx.x, rg = blockIdx.y, tid = threadIdx.x, n = nlist[kv], nk = n * SY_P;
    const float *row = logit + ((size_t)kv * TAKE_PROBE * SY_G + rg) * lstride;
    float m = -INFINITY;
    for (int k = tid; k < nk; k += 256) m = fmaxf(m, row[k]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((tid & 31) == 0) red[tid >> 5] = m;
    __syncthreads();
    m = red[0];
    for (int w = 1; w < 8; w++) m = fmaxf(m, red[w]);
    __syncthreads();
    float l = 0;
    for (int k = tid; k < nk; k += 256) l += row[k] == -INFINITY ? 0.0f : __expf(row[k] - m);
    for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
    if ((tid & 31) == 0) red[tid >> 5] = l;
    __syncthreads();
    l = 0;
    for (int w = 0; w < 8; w++) l += red[w];
    float inv = l > 0 ? 1.0f / l : 0.0f;
    /* a warp per page: lane k takes key k */
    for (int i = tid >> 5; i < n; i += 8) {
        float v = row[i * SY_P + (tid & 31)];
        float p = v == -INFINITY ? 0.0f : __expf(v - m);
        for (int o = 16; o > 0; o >>= 1) p += __shfl_xor_sync(0xffffffffu, p, o);
        if ((tid & 31) == 0) atomicAdd(&score[(size_t)kv * TAKE_CAP + i], p * inv);
    }
}

/* TAKE: keep the `keep` pages of highest score (ties: the earlier page), in position order, then the
 * next chunk's pages [next_first, next_first + next_n). grid (n_kv), block 128. */
__global__ void __launch_bounds__(128) k_take_select(const float *score, int *list, int *nlist, int cap, int keep,
                                                     int next_first, int next_n)
{
    __shared__ int lp[TAKE_CAP], kept[TAKE_CAP];
    __shared__ float sc[TAKE_CAP];
    int kv = blockIdx.x, tid = threadIdx.x, n = nlist[kv];
    int *L = list + (size_t)kv * cap;
    for (int i = tid; i < n; i += 128) lp[i] = L[i], sc[i] = score[(size_t)kv * TAKE_CAP + i], kept[i] = 0;
    __syncthreads();
    for (int i = tid; i < n; i += 128) {
        int rank = 0;
        for (int j = 0; j < n; j++) rank += sc[j] > sc[i] || (sc[j] == sc[i] && lp[j] < lp[i]);
        kept[i] = rank < keep;
    }
    __syncthreads();
    if (tid == 0) {   /* the list is in position order already: keep that order */
        int c = 0;
        for (int i = 0; i < n; i++)
            if (kept[i]) L[c++] = lp[i];
        for (int i = 0; i < next_n; i++) L[c++] = next_first + i;
        nlist[kv] = c;
    }
}

/* greedy token of one row of logits */
__global__ void k_argmax(const float *l, int n, int *tok)
{
    int t = block_argmax(l, n);
    if (threadIdx.x == 0) *tok = t;
}

/* ---------------------------------------------------------------- the prefill */

static int attn_smem_ready(sy_err *E)
{
    cudaError_t e = cudaFuncSetAttribute(k_attn_prefill, cudaFuncAttributeMaxDynamicSharedMemorySize, TC_SMEM);
    if (e != cudaSuccess) {
        snprintf(E->buf, E->len, "prefill attention kernel: %s", cudaGetErrorString(e));
        E->failed = 1;
        return -1;
    }
    return 0;
}

int sy_prefill(sy_model *m, int take, int ctx, int chunk, sy_ttft *out, sy_err *E)
{
    const synth_shape *s = m->s;
    int d = s->n_embd, nh = s->n_head, nkv = s->n_head_kv, ff = s->n_ff, L = s->n_layer;
    int n_qkv = (nh + 2 * nkv) * SY_HD, R = chunk + TAKE_PROBE, np = (ctx + SY_P - 1) / SY_P;
    int cap = take ? TAKE_CAP : np, lstride = TAKE_CAP * SY_P;
    int rc = -1;
    size_t page = (size_t)SY_P * nkv * SY_HD;
    __half **Kl = (__half **)calloc((size_t)L, sizeof(__half *)), **Vl = (__half **)calloc((size_t)L, sizeof(__half *));
    int *hpos = (int *)malloc(sizeof(int) * R), *htok = (int *)malloc(sizeof(int) * R), *hptab = (int *)malloc(sizeof(int) * np);
    int *hlist = (int *)malloc(sizeof(int) * (size_t)nkv * cap), hn[64];
    float *x = NULL, *qkv = NULL, *gu = NULL, *logits = NULL, *ema = NULL, *logit = NULL, *score = NULL;
    __half *xn = NULL, *q16 = NULL, *att = NULL, *h = NULL;
    int *pos = NULL, *tok = NULL, *ptab = NULL, *list = NULL, *nlist = NULL, *first_tok = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float ms = 0;
    if (!Kl || !Vl || !hpos || !htok || !hptab || !hlist || nkv > 64) {
        snprintf(E->buf, E->len, "out of memory");
        E->failed = 1;
        goto fail;
    }
    if (attn_smem_ready(E)) goto fail;
    for (int l = 0; l < L; l++)
        if (!(Kl[l] = (__half *)sy_dalloc((size_t)np * page * 2, E, "the prefill's KV pages")) ||
            !(Vl[l] = (__half *)sy_dalloc((size_t)np * page * 2, E, "the prefill's KV pages")))
            goto fail;
#define A(v, T, n, what) if (!(v = (T *)sy_dalloc((size_t)(n) * sizeof(T), E, what))) goto fail
    A(x, float, (size_t)R * d, "prefill activations");
    A(xn, __half, (size_t)R * d, "prefill activations");
    A(qkv, float, (size_t)R * n_qkv, "prefill activations");
    A(q16, __half, (size_t)R * nh * SY_HD, "prefill activations");
    A(att, __half, (size_t)R * nh * SY_HD, "prefill activations");
    A(gu, float, (size_t)R * 2 * ff, "prefill activations");
    A(h, __half, (size_t)R * ff, "prefill activations");
    A(logits, float, s->n_vocab, "logits");
    A(pos, int, R, "positions");
    A(tok, int, R, "tokens");
    A(first_tok, int, 1, "tokens");
    A(ptab, int, np, "the page table");
    A(list, int, (size_t)L * nkv * cap, "page lists");
    A(nlist, int, (size_t)L * nkv, "page lists");
    if (take) {
        A(ema, float, (size_t)L * TAKE_PROBE * nh * SY_HD, "TAKE's probe");
        A(logit, float, (size_t)nkv * TAKE_PROBE * SY_G * lstride, "TAKE's scores");
        A(score, float, (size_t)nkv * TAKE_CAP, "TAKE's scores");
    }
#undef A
    for (int j = 0; j < np; j++) hptab[j] = (int)(((long long)j * 7919) % np);   /* scattered, as a pool leaves pages */
    if (np % 7919 == 0) for (int j = 0; j < np; j++) hptab[j] = j;
    CK(cudaMemcpy(ptab, hptab, sizeof(int) * np, cudaMemcpyHostToDevice), "page table");
    CK(cudaEventCreate(&e0), "event");
    CK(cudaEventCreate(&e1), "event");
    CK(cudaStreamSynchronize(m->st), "prefill");
    CK(cudaEventRecord(e0, m->st), "event");
    for (int p0 = 0; p0 < ctx; p0 += chunk) {
        int n = ctx - p0 < chunk ? ctx - p0 : chunk, last = p0 + n >= ctx;
        int probe_rows = take && !last ? TAKE_PROBE : 0, rows = n + probe_rows;
        int probe_first = last ? (n > TAKE_PROBE ? n - TAKE_PROBE : 0) : n;   /* the question: its own rows at the end */
        for (int r = 0; r < n; r++) hpos[r] = p0 + r, htok[r] = (int)((p0 + r) * 2654435761u % (unsigned)s->n_vocab);
        for (int r = 0; r < probe_rows; r++) {
            int pp = ctx - TAKE_PROBE + r;
            hpos[n + r] = pp, htok[n + r] = (int)(pp * 2654435761u % (unsigned)s->n_vocab);
        }
        CK(cudaMemcpyAsync(pos, hpos, sizeof(int) * rows, cudaMemcpyHostToDevice, m->st), "positions");
        CK(cudaMemcpyAsync(tok, htok, sizeof(int) * rows, cudaMemcpyHostToDevice, m->st), "tokens");
        int last_page = (p0 + n - 1) / SY_P;
        if (!take) {   /* every page so far, for every layer and KV head */
            for (int kv = 0; kv < nkv; kv++) {
                for (int j = 0; j <= last_page; j++) hlist[(size_t)kv * cap + j] = j;
                hn[kv] = last_page + 1;
            }
            CK(cudaMemcpyAsync(list, hlist, sizeof(int) * (size_t)nkv * cap, cudaMemcpyHostToDevice, m->st), "page lists");
            CK(cudaMemcpyAsync(nlist, hn, sizeof(int) * nkv, cudaMemcpyHostToDevice, m->st), "page lists");
        } else if (p0 == 0) {   /* the first chunk's pages, in every layer */
            for (int l = 0; l < L; l++)
                for (int kv = 0; kv < nkv; kv++) {
                    for (int j = 0; j <= last_page; j++) hlist[(size_t)kv * cap + j] = j;
                    hn[kv] = last_page + 1;
                    CK(cudaMemcpyAsync(list + ((size_t)l * nkv + kv) * cap, hlist + (size_t)kv * cap, sizeof(int) * cap,
                                       cudaMemcpyHostToDevice, m->st), "page lists");
                }
            for (int l = 0; l < L; l++)
                CK(cudaMemcpyAsync(nlist + (size_t)l * nkv, hn, sizeof(int) * nkv, cudaMemcpyHostToDevice, m->st), "page lists");
            CK(cudaStreamSynchronize(m->st), "page lists");   /* hlist is rewritten below */
        }
        k_embed<<<rows, 256, 0, m->st>>>(m->emb, d, tok, x);
        for (int l = 0; l < L; l++) {
            sy_layer *y = &m->L[l];
            const int *ll = take ? list + (size_t)l * nkv * cap : list, *nl = take ? nlist + (size_t)l * nkv : nlist;
            k_rmsnorm<<<rows, 256, 0, m->st>>>(x, y->attn_norm, xn, d, 1e-5f);
            CKB(sy_gemm(m, y->wqkv, n_qkv, d, xn, rows, qkv, 0), "QKV product");
            k_rope_prefill<<<dim3(nh + nkv, rows), SY_HD / 2, 0, m->st>>>(qkv, q16, Kl[l], Vl[l], pos, ptab, nh, nkv, n, s->rope_base,
                                                                         1.0f / sqrtf((float)SY_HD));
            k_attn_prefill<<<dim3((rows + PF_ROWS - 1) / PF_ROWS, nkv), 256, TC_SMEM, m->st>>>(q16, pos, rows, Kl[l], Vl[l], ptab, ll, nl,
                                                                                                cap, p0 + n, nkv, att);
            CK(cudaGetLastError(), "prefill attention");
            if (take) {
                int keep = (l < L / 2 ? 2 : 1) * TAKE_BUDGET / SY_P;   /* delayed eviction in the first half */
                int next = last ? 0 : (ctx - (p0 + n) < chunk ? ctx - (p0 + n) : chunk);
                k_take_ema<<<64, 256, 0, m->st>>>(q16, probe_first, TAKE_PROBE * nh * SY_HD, ema + (size_t)l * TAKE_PROBE * nh * SY_HD,
                                                  p0 == 0);
                k_take_logits<<<dim3(TAKE_CAP, nkv), 128, 0, m->st>>>(ema + (size_t)l * TAKE_PROBE * nh * SY_HD, Kl[l], ptab, ll, nl, cap,
                                                                      p0 + n, nkv, logit, lstride);
                CK(cudaMemsetAsync(score, 0, sizeof(float) * (size_t)nkv * TAKE_CAP, m->st), "TAKE");
                k_take_mass<<<dim3(nkv, TAKE_PROBE * SY_G), 256, 0, m->st>>>(logit, nl, nkv, lstride, score);
                k_take_select<<<nkv, 128, 0, m->st>>>(score, list + (size_t)l * nkv * cap, nlist + (size_t)l * nkv, cap, keep,
                                                      (p0 + n) / SY_P, (next + SY_P - 1) / SY_P);
                CK(cudaGetLastError(), "TAKE");
            }
            CKB(sy_gemm(m, y->wo, d, nh * SY_HD, att, rows, x, 1), "output product");
            k_rmsnorm<<<rows, 256, 0, m->st>>>(x, y->ffn_norm, xn, d, 1e-5f);
            CKB(sy_gemm(m, y->wgu, 2 * ff, d, xn, rows, gu, 0), "gate/up product");
            k_swiglu<<<grid_for((size_t)rows * ff), 256, 0, m->st>>>(gu, h, ff, rows);
            CKB(sy_gemm(m, y->wdown, d, ff, h, rows, x, 1), "down product");
            CK(cudaGetLastError(), "a prefill kernel");
        }
        if (last) {   /* the first token: the last prompt row's logits */
            k_rmsnorm<<<1, 256, 0, m->st>>>(x + (size_t)(n - 1) * d, m->out_norm, xn, d, 1e-5f);
            CKB(sy_gemm(m, m->out, s->n_vocab, d, xn, 1, logits, 0), "output matrix");
            k_argmax<<<1, 1024, 0, m->st>>>(logits, s->n_vocab, first_tok);
            CK(cudaGetLastError(), "sampling");
        }
    }
    CK(cudaEventRecord(e1, m->st), "event");
    CK(cudaEventSynchronize(e1), "prefill");
    CK(cudaEventElapsedTime(&ms, e0, e1), "event");
    out->ms = ms;
    out->peak_gib = sy_used_gib();
    /* K and V of the tokens a layer holds at most, over all layers (TAKE: half of them at 2k) */
    out->kv_kept_gib = (take ? (L / 2 * (2.0 * TAKE_BUDGET + chunk) + (L - L / 2) * ((double)TAKE_BUDGET + chunk)) : (double)L * ctx) *
                       nkv * SY_HD * 2 * 2 / 1073741824.0;
    rc = 0;
fail:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    for (int l = 0; Kl && Vl && l < L; l++) cudaFree(Kl[l]), cudaFree(Vl[l]);
    cudaFree(x), cudaFree(xn), cudaFree(qkv), cudaFree(q16), cudaFree(att), cudaFree(gu), cudaFree(h), cudaFree(logits);
    cudaFree(pos), cudaFree(tok), cudaFree(first_tok), cudaFree(ptab), cudaFree(list), cudaFree(nlist);
    cudaFree(ema), cudaFree(logit), cudaFree(score);
    free(Kl), free(Vl), free(hpos), free(htok), free(hptab), free(hlist);
    return rc;
}

/* ---------------------------------------------------------------- self-check */

/* 37 rows (29 of a chunk at positions 100.., 8 probe rows at 300..) of 2 KV heads over lists with a
 * gap, against a double-precision host reference; the largest error relative to the output's scale */
int sy_prefill_selfcheck(double *err_out, sy_err *E)
{
    const int nkv = 2, nh = nkv * SY_G, rows = 37, np = 5, kv_len = 129, cap = 8;
    size_t page = (size_t)SY_P * nkv * SY_HD;
    uint64_t st = 777;
    int rc = -1, hpos[rows], hptab[np] = { 3, 0, 4, 1, 2 }, hlist[nkv * cap], hn[nkv] = { 5, 4 };
    __half *hK = (__half *)malloc(np * page * 2), *hV = (__half *)malloc(np * page * 2);
    __half *hq = (__half *)malloc(sizeof(__half) * rows * nh * SY_HD), *ho = (__half *)malloc(sizeof(__half) * rows * nh * SY_HD);
    __half *dK = NULL, *dV = NULL, *dq = NULL, *dout = NULL;
    int *dpos = NULL, *dptab = NULL, *dl = NULL, *dn = NULL, hlist2[2 * 8], hn2[2];
    float *dema = NULL, *dlogit = NULL, *dscore = NULL;
    double worst = 0;
    if (!hK || !hV || !hq || !ho) {
        snprintf(E->buf, E->len, "out of memory");
        goto fail;
    }
    if (attn_smem_ready(E)) goto fail;
    for (size_t i = 0; i < np * page; i++) hK[i] = __float2half((float)sy_rand(&st)), hV[i] = __float2half((float)sy_rand(&st));
    for (int i = 0; i < rows * nh * SY_HD; i++) hq[i] = __float2half((float)sy_rand(&st) * 0.3f);
    for (int r = 0; r < rows; r++) hpos[r] = r < 29 ? 100 + r : 300 + r;
    for (int j = 0; j < 5; j++) hlist[j] = j;                    /* KV head 0: every page */
    { int g[4] = { 0, 2, 3, 4 }; for (int j = 0; j < 4; j++) hlist[cap + j] = g[j]; }   /* KV head 1: page 1 evicted */
#define A(v, T, n) if (!(v = (T *)sy_dalloc((size_t)(n) * sizeof(T), E, "self-check"))) goto fail
    A(dK, __half, np * page);
    A(dV, __half, np * page);
    A(dq, __half, rows * nh * SY_HD);
    A(dout, __half, rows * nh * SY_HD);
    A(dpos, int, rows);
    A(dptab, int, np);
    A(dl, int, nkv * cap);
    A(dn, int, nkv);
#undef A
    CK(cudaMemcpy(dK, hK, np * page * 2, cudaMemcpyHostToDevice), "self-check");
    CK(cudaMemcpy(dV, hV, np * page * 2, cudaMemcpyHostToDevice), "self-check");
    CK(cudaMemcpy(dq, hq, sizeof(__half) * rows * nh * SY_HD, cudaMemcpyHostToDevice), "self-check");
    CK(cudaMemcpy(dpos, hpos, sizeof hpos, cudaMemcpyHostToDevice), "self-check");
    CK(cudaMemcpy(dptab, hptab, sizeof hptab, cudaMemcpyHostToDevice), "self-check");
    CK(cudaMemcpy(dl, hlist, sizeof hlist, cudaMemcpyHostToDevice), "self-check");
    CK(cudaMemcpy(dn, hn, sizeof hn, cudaMemcpyHostToDevice), "self-check");
    CK(cudaMemset(dout, 0xff, sizeof(__half) * rows * nh * SY_HD), "self-check");   /* NaN: unwritten shows */
    k_attn_prefill<<<dim3((rows + PF_ROWS - 1) / PF_ROWS, nkv), 256, TC_SMEM>>>(dq, dpos, rows, dK, dV, dptab, dl, dn, cap, kv_len, nkv, dout);
    CK(cudaGetLastError(), "self-check prefill attention");
    CK(cudaMemcpy(ho, dout, sizeof(__half) * rows * nh * SY_HD, cudaMemcpyDeviceToHost), "self-check");
    for (int r = 0; r < rows; r++)
        for (int hh = 0; hh < nh; hh++) {
            int kv = hh / SY_G;
            double mx = -1e300, sum = 0, o[SY_HD] = { 0 }, scale = 1e-9, dmax = 0;
            for (int pass = 0; pass < 2; pass++)
                for (int i = 0; i < hn[kv]; i++)
                    for (int k = 0; k < SY_P; k++) {
                        int lp = hlist[kv * cap + i], kp = lp * SY_P + k;
                        if (kp > hpos[r] || kp >= kv_len) continue;
                        size_t at = (((size_t)hptab[lp] * nkv + kv) * SY_P + k) * SY_HD;
                        double dot = 0;
                        for (int d = 0; d < SY_HD; d++) dot += (double)__half2float(hq[((size_t)r * nh + hh) * SY_HD + d]) * __half2float(hK[at + d]);
                        if (pass == 0) mx = dot > mx ? dot : mx;
                        else {
                            double p = exp(dot - mx);
                            sum += p;
                            for (int d = 0; d < SY_HD; d++) o[d] += p * __half2float(hV[at + d]);
                        }
                    }
            for (int d = 0; d < SY_HD; d++) {
                double ref = o[d] / sum, got = __half2float(ho[((size_t)r * nh + hh) * SY_HD + d]);
                scale = fabs(ref) > scale ? fabs(ref) : scale;
                double e = got == got ? fabs(got - ref) : 1e9;
                dmax = e > dmax ? e : dmax;
            }
            if (dmax / scale > worst) worst = dmax / scale;
        }
    *err_out = worst;
    /* TAKE's page scores for the same pages and lists, and its choice */
    {
        const int lstride = TAKE_CAP * SY_P, nq = TAKE_PROBE * nh * SY_HD;
        float *hema = (float *)malloc(sizeof(float) * nq), hs[2 * TAKE_CAP];
        if (!hema) {
            snprintf(E->buf, E->len, "out of memory");
            goto fail;
        }
        for (int i = 0; i < nq; i++) hema[i] = (float)sy_rand(&st) * 0.2f;
        int ok = (dema = (float *)sy_dalloc(sizeof(float) * nq, E, "self-check")) &&
                 (dlogit = (float *)sy_dalloc(sizeof(float) * nkv * TAKE_PROBE * SY_G * lstride, E, "self-check")) &&
                 (dscore = (float *)sy_dalloc(sizeof(float) * nkv * TAKE_CAP, E, "self-check")) &&
                 cudaMemcpy(dema, hema, sizeof(float) * nq, cudaMemcpyHostToDevice) == cudaSuccess &&
                 cudaMemset(dscore, 0, sizeof(float) * nkv * TAKE_CAP) == cudaSuccess;
        if (ok) {
            k_take_logits<<<dim3(TAKE_CAP, nkv), 128>>>(dema, dK, dptab, dl, dn, cap, kv_len, nkv, dlogit, lstride);
            k_take_mass<<<dim3(nkv, TAKE_PROBE * SY_G), 256>>>(dlogit, dn, nkv, lstride, dscore);
            ok = cudaGetLastError() == cudaSuccess &&
                 cudaMemcpy(hs, dscore, sizeof(float) * nkv * TAKE_CAP, cudaMemcpyDeviceToHost) == cudaSuccess;
        }
        for (int kv = 0; ok && kv < nkv; kv++) {
            double want[8] = { 0 };
            for (int rg = 0; rg < TAKE_PROBE * SY_G; rg++) {
                const float *qv = hema + ((size_t)(rg / SY_G) * nh + kv * SY_G + rg % SY_G) * SY_HD;
                double lg[8 * SY_P], mx = -1e300, sum = 0;
                for (int i = 0; i < hn[kv]; i++)
                    for (int k = 0; k < SY_P; k++) {
                        int lp = hlist[kv * cap + i];
                        double dot = 0;
                        size_t at = (((size_t)hptab[lp] * nkv + kv) * SY_P + k) * SY_HD;
                        for (int d = 0; d < SY_HD; d++) dot += (double)qv[d] * __half2float(hK[at + d]);
                        lg[i * SY_P + k] = lp * SY_P + k < kv_len ? dot : -1e300;
                        if (lg[i * SY_P + k] > mx) mx = lg[i * SY_P + k];
                    }
                for (int k = 0; k < hn[kv] * SY_P; k++) sum += lg[k] > -1e299 ? exp(lg[k] - mx) : 0;
                for (int k = 0; k < hn[kv] * SY_P; k++) want[k / SY_P] += lg[k] > -1e299 ? exp(lg[k] - mx) / sum : 0;
            }
            for (int i = 0; i < hn[kv]; i++)
                if (!(fabs(hs[kv * TAKE_CAP + i] - want[i]) <= 1e-3 * (want[i] + 1))) {
                    snprintf(E->buf, E->len, "self-check: TAKE's score of page %d (KV head %d) is %g, not %g", i, kv,
                             hs[kv * TAKE_CAP + i], want[i]);
                    E->failed = 1, ok = 0;
                    break;
                }
        }
        if (ok) {   /* keep the 2 best of each list, then pages 10 and 11 */
            k_take_select<<<nkv, 128>>>(dscore, dl, dn, cap, 2, 10, 2);
            ok = cudaGetLastError() == cudaSuccess && cudaMemcpy(hlist2, dl, sizeof hlist2, cudaMemcpyDeviceToHost) == cudaSuccess &&
                 cudaMemcpy(hn2, dn, sizeof hn2, cudaMemcpyDeviceToHost) == cudaSuccess;
            for (int kv = 0; ok && kv < nkv; kv++) {
                int b1 = -1, b2 = -1;   /* the two best, by score then page */
                for (int i = 0; i < hn[kv]; i++) {
                    float v = hs[kv * TAKE_CAP + i];
                    if (b1 < 0 || v > hs[kv * TAKE_CAP + b1]) b2 = b1, b1 = i;
                    else if (b2 < 0 || v > hs[kv * TAKE_CAP + b2]) b2 = i;
                }
                int lo = b1 < b2 ? b1 : b2, hi = b1 < b2 ? b2 : b1;
                const int *got = hlist2 + kv * cap;
                if (hn2[kv] != 4 || got[0] != hlist[kv * cap + lo] || got[1] != hlist[kv * cap + hi] || got[2] != 10 || got[3] != 11) {
                    snprintf(E->buf, E->len, "self-check: TAKE kept pages %d %d (+%d %d), not %d %d", got[0], got[1], got[2], got[3],
                             hlist[kv * cap + lo], hlist[kv * cap + hi]);
                    E->failed = 1, ok = 0;
                }
            }
        }
        free(hema);
        if (!ok) {
            if (!E->failed) snprintf(E->buf, E->len, "self-check: TAKE's kernels failed");
            E->failed = 1;
            goto fail;
        }
    }
    rc = 0;
fail:
    cudaFree(dK), cudaFree(dV), cudaFree(dq), cudaFree(dout), cudaFree(dpos), cudaFree(dptab), cudaFree(dl), cudaFree(dn);
    cudaFree(dema), cudaFree(dlogit), cudaFree(dscore);
    free(hK), free(hV), free(hq), free(ho);
    return rc;
}
