/* synthetic.cu - the device-resident decode step of a Llama-shaped model with random f16 weights, for
 * `kvchat bench --device cuda --synthetic llama-8b` (kernels/synthetic.h).
 *
 * Everything lives on the GPU: weights (f16, made by a hash kernel, no file), the paged KV cache
 * (f16, pages of 32 tokens as in the engine, reached through a page table), the page summaries the
 * policies read (CHESS: per-page key sums over all layers and KV heads; Quest: per-page element-wise
 * key min/max per layer and KV head), the residual stream, the logits and the sampled tokens. One
 * decode step of a batch is: per layer RMSNorm, the fused QKV product (cuBLAS), RoPE with the K/V
 * page writes and summary updates, paged split-K attention over each (sequence, KV head)'s page list,
 * the output product added into the residual, RMSNorm, gate+up product, SwiGLU, down product; then
 * the final norm, the output product, greedy sampling and the next tokens' embedding rows. Positions
 * live on the device and advance in the step, so the step is captured once in a CUDA graph and
 * replayed.
 *
 * Policies, as the engine's (engine/policy/chess.c, quest.c) decide:
 *   full   every page of the sequence;
 *   chess  sink page + pages selected by the hierarchical grid/chunk/page scoring of the mean key
 *          rows against the anchor (mean of the recent-window pages; cosine) + every page from the
 *          window on, rebuilt every `every` (6) generated pages: the rebuild runs outside the graph
 *          and is timed on its own, then amortised into the step;
 *   quest  per layer and KV head, the budget/P pages of highest bound sum_i max(q_i min_i, q_i max_i)
 *          (summed over the query heads of the group) plus the page being written, chosen inside the
 *          step on the device.
 * The context's keys and values are random (there is no prefill in this benchmark): the selections are
 * real computations on real data, their quality is not what is measured here. */
#include <math.h>
#include <stdlib.h>

extern "C" {
#include "kernels/backend.h"
}
#include "kernels/attn_group.h"
#include "kernels/cuda/synthetic_impl.cuh"

#define SY_THREADS 128
#define CHESS_SINK 1
#define CHESS_WINDOW 2
#define CHESS_CHUNK 4
#define CHESS_GRID 4
#define CHESS_EVERY 6
/* the aggressive preset: fractions of grids, chunks, pages kept */
__device__ __forceinline__ double chess_rho_dev(int level) { return level == 0 ? 0.5 : level == 1 ? 0.2 : 0.1; }

/* ---------------------------------------------------------------- kernels */

__device__ __forceinline__ float hash_unit(uint64_t i, uint64_t seed)
{
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 32;
    return (float)(x >> 40) * (2.0f / 16777216.0f) - 1.0f;   /* uniform in [-1, 1) */
}

__global__ void k_fill_half(__half *p, size_t n, uint64_t seed, float scale)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = __float2half(hash_unit(i, seed) * scale);
}

__global__ void k_fill_f32(float *p, size_t n, float v)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = v;
}

/* y = x / rms(x) * w, f32 in, f16 out (the products' input); one block per row */
__global__ void k_rmsnorm(const float *x, const float *w, __half *y, int d, float eps)
{
    pdl_enter();
    __shared__ float red[32];
    const float *xr = x + (size_t)blockIdx.x * d;
    float ss = 0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
    float inv = rsqrtf(block_sum(ss, red) / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) y[(size_t)blockIdx.x * d + i] = __float2half(xr[i] * inv * w[i]);
}

/* RoPE (adjacent pairs) of the query heads into q (f32), and of the key head into the page being
 * written, with its value; the page's summaries follow: CHESS's key sums (f32, [page][layer][kv][d]),
 * Quest's element-wise min/max (f16, [layer][page][kv][d]), reset at a page's first row.
 * grid (n_head + n_kv, B), block HD/2. */
__global__ void k_rope_write(const float *qkv, float *q, __half *K, __half *V, float *ksum, __half *kmin,
                             __half *kmax, const int *pos, const int *ptab, int pt_stride, int n_head, int n_kv,
                             int n_layer, int layer, size_t n_phys, float base)
{
    pdl_enter();
    int h = blockIdx.x, b = blockIdx.y, i = threadIdx.x, hd = SY_HD;
    int p = pos[b];
    int qkv_w = (n_head + 2 * n_kv) * hd;
    float theta = (float)p * powf(base, -2.0f * (float)i / (float)hd);
    float c, s;
    sincosf(theta, &s, &c);
    const float *row = qkv + (size_t)b * qkv_w;
    if (h < n_head) {
        float x0 = row[h * hd + 2 * i], x1 = row[h * hd + 2 * i + 1];
        float *o = q + ((size_t)b * n_head + h) * hd;
        o[2 * i] = x0 * c - x1 * s;
        o[2 * i + 1] = x0 * s + x1 * c;
        return;
    }
    int kv = h - n_head;
    float x0 = row[(n_head + kv) * hd + 2 * i], x1 = row[(n_head + kv) * hd + 2 * i + 1];
    float k0 = x0 * c - x1 * s, k1 = x0 * s + x1 * c;
    float v0 = row[(n_head + n_kv + kv) * hd + 2 * i], v1 = row[(n_head + n_kv + kv) * hd + 2 * i + 1];
    int phys = ptab[b * pt_stride + p / SY_P], slot = p % SY_P;
    size_t at = (((size_t)phys * n_kv + kv) * SY_P + slot) * hd + 2 * i;
    __half hk0 = __float2half(k0), hk1 = __float2half(k1);
    K[at] = hk0;
    K[at + 1] = hk1;
    V[at] = __float2half(v0);
    V[at + 1] = __float2half(v1);
    float *ks = ksum + (((size_t)phys * n_layer + layer) * n_kv + kv) * hd + 2 * i;
    size_t mm = (((size_t)layer * n_phys + phys) * n_kv + kv) * hd + 2 * i;
    if (slot == 0) {
        ks[0] = __half2float(hk0), ks[1] = __half2float(hk1);
        kmin[mm] = kmax[mm] = hk0;
        kmin[mm + 1] = kmax[mm + 1] = hk1;
    } else {
        ks[0] += __half2float(hk0), ks[1] += __half2float(hk1);
        kmin[mm] = __hmin(kmin[mm], hk0), kmax[mm] = __hmax(kmax[mm], hk0);
        kmin[mm + 1] = __hmin(kmin[mm + 1], hk1), kmax[mm + 1] = __hmax(kmax[mm + 1], hk1);
    }
}

/* issue the copies of one page (K and V of one KV head, at base, swizzled) into a stage */
__device__ __forceinline__ void tc_load_page(__half *stg, const __half *K, const __half *V, size_t base, int lane)
{
#pragma unroll
    for (int i = 0; i < (SY_P * SY_HD / 8) / 32; i++) {   /* 16 chunks of K and 16 of V per lane */
        int c = i * 32 + lane, row = c >> 4, ch = c & 15;
        cp_async16(stg + swz(row, ch), K + base + (size_t)c * 8);
        cp_async16(stg + TC_PAGE_HALVES + swz(row, ch), V + base + (size_t)c * 8);
    }
}

/* Split-K paged attention for one (split, KV head, sequence) on the tensor cores, one warp per block.
 * A list holds logical page indices of the sequence; rows at or past the sequence's length are not
 * attended. Pages stream into shared memory through cp.async, TC_STAGES deep, their 16-byte chunks
 * swizzled by row (chunk ^ row%8) so that ldmatrix reads are free of bank conflicts. Per page of 32
 * keys: S^T = K Q^T as m16n8k16 products (keys x the group's 4 query heads, padded to 8), the online
 * softmax per head across the lanes that hold it, then O^T += V^T P^T (dims x heads), P^T passing
 * through a small shared array to change fragment layout. f16 operands, f32 accumulation. Partial
 * results (max, sum, unnormalised output) go to part_*; k_attn_combine merges them. */
__global__ void __launch_bounds__(32) k_attn(const float *q, const __half *K, const __half *V, const int *ptab,
                                             int pt_stride, const int *list, const int *nlist, int cap,
                                             const int *pos, int n_kv, int n_split, float scale, float *part_o,
                                             float *part_ml)
{
    pdl_enter();
    extern __shared__ __align__(128) unsigned char smem[];
    __half *stages = (__half *)smem;
    __shared__ __align__(16) __half ps[8][SY_P + 8];   /* P^T staging: heads x keys (+8: fewer conflicts) */
    int sp = blockIdx.x, kv = blockIdx.y, b = blockIdx.z, lane = threadIdx.x;
    int g = lane >> 2, t = lane & 3;
    int n_head = n_kv * SY_G;
    int n = nlist[b * n_kv + kv], per = (n + n_split - 1) / n_split;
    int i0 = sp * per, i1 = min(n, i0 + per);
    int len = pos[b] + 1;
    const int *lst = list + ((size_t)b * n_kv + kv) * cap;
    /* Q^T as the B operand: lane holds head g (zero beyond the group's 4), dims 2t, 2t+1 (+8) of each 16 */
    unsigned qf[8][2];
    {
        const float *qh = q + ((size_t)b * n_head + kv * SY_G + (g < SY_G ? g : 0)) * SY_HD;
#pragma unroll
        for (int kk = 0; kk < 8; kk++) {
            int d = kk * 16 + 2 * t;
            float m = g < SY_G ? scale : 0.0f;
            qf[kk][0] = pack_half2(qh[d] * m, qh[d + 1] * m);
            qf[kk][1] = pack_half2(qh[d + 8] * m, qh[d + 9] * m);
        }
    }
    float o[8][4];   /* O^T: dim tile mt, dims 16mt+g (+8), heads 2t, 2t+1 */
#pragma unroll
    for (int mt = 0; mt < 8; mt++) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;
    float m_run[2] = { -INFINITY, -INFINITY }, l_run[2] = { 0.0f, 0.0f };   /* heads 2t, 2t+1 */
    /* prologue: the first TC_STAGES-1 pages in flight */
#pragma unroll
    for (int s = 0; s < TC_STAGES - 1; s++) {
        if (i0 + s < i1) {
            int lp = lst[i0 + s];
            size_t base = ((size_t)ptab[b * pt_stride + lp] * n_kv + kv) * TC_PAGE_HALVES;
            tc_load_page(stages + s * 2 * TC_PAGE_HALVES, K, V, base, lane);
        }
        cp_commit();
    }
    for (int i = i0; i < i1; i++) {
        int ahead = i + TC_STAGES - 1;
        if (ahead < i1) {
            int lp = lst[ahead];
            size_t base = ((size_t)ptab[b * pt_stride + lp] * n_kv + kv) * TC_PAGE_HALVES;
            tc_load_page(stages + ((ahead - i0) % TC_STAGES) * 2 * TC_PAGE_HALVES, K, V, base, lane);
        }
        cp_commit();
        cp_wait<TC_STAGES - 1>();
        __syncwarp();
        int valid = min(SY_P, len - lst[i] * SY_P);
        const __half *kp = stages + ((i - i0) % TC_STAGES) * 2 * TC_PAGE_HALVES, *vp = kp + TC_PAGE_HALVES;
        if (valid > 0) {
            /* S^T for keys 16*kt + (g, g+8), heads 2t, 2t+1 */
            float sc[2][4];
#pragma unroll
            for (int kt = 0; kt < 2; kt++) {
                sc[kt][0] = sc[kt][1] = sc[kt][2] = sc[kt][3] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < 8; kk++) {
                    unsigned a[4];
                    int row = kt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, ch = kk * 2 + (lane >> 4);
                    ldsm_x4(a, kp + swz(row, ch));
                    mma16816(sc[kt], a, qf[kk][0], qf[kk][1]);
                }
            }
            /* mask, then the online softmax of heads 2t, 2t+1 over the page's 32 keys */
            float mx[2] = { -INFINITY, -INFINITY };
#pragma unroll
            for (int kt = 0; kt < 2; kt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int key = kt * 16 + g + (e >> 1) * 8;
                    if (key >= valid) sc[kt][e] = -INFINITY;
                    mx[e & 1] = fmaxf(mx[e & 1], sc[kt][e]);
                }
            float f[2], sum[2] = { 0.0f, 0.0f };
#pragma unroll
            for (int h = 0; h < 2; h++) {
                for (int off = 4; off < 32; off <<= 1) mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], off));
                float mn = fmaxf(m_run[h], mx[h]);
                f[h] = m_run[h] == -INFINITY ? 0.0f : __expf(m_run[h] - mn);
                m_run[h] = mn;
            }
#pragma unroll
            for (int kt = 0; kt < 2; kt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float p = sc[kt][e] == -INFINITY ? 0.0f : __expf(sc[kt][e] - m_run[e & 1]);
                    sum[e & 1] += p;
                    ps[2 * t + (e & 1)][kt * 16 + g + (e >> 1) * 8] = __float2half(p);
                }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                for (int off = 4; off < 32; off <<= 1) sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], off);
                l_run[h] = l_run[h] * f[h] + sum[h];
            }
#pragma unroll
            for (int mt = 0; mt < 8; mt++) o[mt][0] *= f[0], o[mt][1] *= f[1], o[mt][2] *= f[0], o[mt][3] *= f[1];
            __syncwarp();
            /* O^T += V^T P^T: P^T as the B operand (keys 2t.. of each 16, head g) */
#pragma unroll
            for (int kt = 0; kt < 2; kt++) {
                unsigned pb0 = *(const unsigned *)&ps[g][kt * 16 + 2 * t], pb1 = *(const unsigned *)&ps[g][kt * 16 + 2 * t + 8];
#pragma unroll
                for (int mt = 0; mt < 8; mt++) {
                    unsigned a[4];
                    int j = lane >> 3, row = kt * 16 + (lane & 7) + (j >> 1) * 8, ch = mt * 2 + (j & 1);
                    ldsm_x4_t(a, vp + swz(row, ch));
                    mma16816(o[mt], a, pb0, pb1);
                }
            }
        }
        __syncwarp();   /* the stage is overwritten by a later iteration's copies */
    }
    cp_wait<0>();
    if (t < 2) {   /* heads 2t, 2t+1 of the group */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            size_t row = ((size_t)b * n_head + kv * SY_G + 2 * t + h) * n_split + sp;
#pragma unroll
            for (int mt = 0; mt < 8; mt++) {
                part_o[row * SY_HD + mt * 16 + g] = o[mt][h];
                part_o[row * SY_HD + mt * 16 + g + 8] = o[mt][2 + h];
            }
            if (g == 0) part_ml[row * 2] = m_run[h], part_ml[row * 2 + 1] = l_run[h];
        }
    }
}

/* y[b][n] (f32) = sum_k W[n][k] x[b][k] (+ y when acc), W f16 [N][K], x f16 [B][K], for the small
 * batches of decode, where a product is one pass over W: each block takes 4 rows, its 8 warps
 * interleave over K in chunks of 256 (16-byte loads), partial sums meet in shared memory. */
template <int NB>
__global__ void __launch_bounds__(256) k_gemv(const __half *W, const __half *x, float *y, int N, int K, int acc)
{
    pdl_enter();
    __shared__ float part[8][4][NB];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n0 = blockIdx.x * 4;
    float s[4][NB];
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
        for (int b = 0; b < NB; b++) s[r][b] = 0.0f;
    for (int k = warp * 256 + lane * 8; k < K; k += 8 * 256) {
        uint4 wv[4], xv[NB];
#pragma unroll
        for (int r = 0; r < 4; r++) wv[r] = n0 + r < N ? *(const uint4 *)(W + (size_t)(n0 + r) * K + k) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int b = 0; b < NB; b++) xv[b] = *(const uint4 *)(x + (size_t)b * K + k);
#pragma unroll
        for (int b = 0; b < NB; b++) {
            const __half2 *xh = (const __half2 *)&xv[b];
            float2 x0 = __half22float2(xh[0]), x1 = __half22float2(xh[1]), x2 = __half22float2(xh[2]),
                   x3 = __half22float2(xh[3]);
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const __half2 *wh = (const __half2 *)&wv[r];
                float2 w0 = __half22float2(wh[0]), w1 = __half22float2(wh[1]), w2 = __half22float2(wh[2]),
                       w3 = __half22float2(wh[3]);
                s[r][b] += w0.x * x0.x + w0.y * x0.y + w1.x * x1.x + w1.y * x1.y + w2.x * x2.x + w2.y * x2.y +
                           w3.x * x3.x + w3.y * x3.y;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
        for (int b = 0; b < NB; b++) {
            float v = s[r][b];
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0) part[warp][r][b] = v;
        }
    __syncthreads();
    if (threadIdx.x < 4 * NB) {
        int r = threadIdx.x / NB, b = threadIdx.x % NB;
        float v = 0;
#pragma unroll
        for (int w = 0; w < 8; w++) v += part[w][r][b];
        if (n0 + r < N) {
            float *o = y + (size_t)b * N + n0 + r;
            *o = acc ? *o + v : v;
        }
    }
}

/* y[b][n] (f32) = sum_k W[n][k] x[b][k] (+ y when acc) for batches of 1..32 on the tensor cores, one
 * pass over W. Block: 16 rows of W, its 8 warps interleaving over K in tiles of 64. A lane loads 16
 * consecutive halves of rows g and g+8 of W and of batch row g (+8 per n-tile) of x with 16-byte
 * loads; since a dot product may sum in any order, the four m16n8k16 products of a tile take those
 * registers as they are, the same permutation of k on both sides. Partial sums meet in shared memory.
 * K must be a multiple of 64. */
template <int NT>
__global__ void __launch_bounds__(256) k_gemm_tc(const __half *W, const __half *x, float *y, int N, int K, int B, int acc)
{
    __shared__ float part[8][NT * 8][17];
    pdl_enter();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, n0 = blockIdx.x * 16;
    float c[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.0f;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    bool ra = n0 + g < N, rb = n0 + g + 8 < N;
    for (int k0 = warp * 64; k0 < K; k0 += 8 * 64) {
        int k = k0 + 16 * t;
        uint4 wa0 = ra ? *(const uint4 *)(W + (size_t)(n0 + g) * K + k) : zero;
        uint4 wa1 = ra ? *(const uint4 *)(W + (size_t)(n0 + g) * K + k + 8) : zero;
        uint4 wb0 = rb ? *(const uint4 *)(W + (size_t)(n0 + g + 8) * K + k) : zero;
        uint4 wb1 = rb ? *(const uint4 *)(W + (size_t)(n0 + g + 8) * K + k + 8) : zero;
        uint4 xv0[NT], xv1[NT];
#pragma unroll
        for (int j = 0; j < NT; j++) {
            bool in = j * 8 + g < B;
            xv0[j] = in ? *(const uint4 *)(x + (size_t)(j * 8 + g) * K + k) : zero;
            xv1[j] = in ? *(const uint4 *)(x + (size_t)(j * 8 + g) * K + k + 8) : zero;
        }
        const unsigned aw[8] = { wa0.x, wa0.y, wa0.z, wa0.w, wa1.x, wa1.y, wa1.z, wa1.w };
        const unsigned bw[8] = { wb0.x, wb0.y, wb0.z, wb0.w, wb1.x, wb1.y, wb1.z, wb1.w };
#pragma unroll
        for (int s = 0; s < 4; s++) {
            unsigned a[4] = { aw[2 * s], bw[2 * s], aw[2 * s + 1], bw[2 * s + 1] };
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const unsigned xw[8] = { xv0[j].x, xv0[j].y, xv0[j].z, xv0[j].w, xv1[j].x, xv1[j].y, xv1[j].z, xv1[j].w };
                mma16816(c[j], a, xw[2 * s], xw[2 * s + 1]);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NT; j++) {
        part[warp][j * 8 + 2 * t][g] = c[j][0];
        part[warp][j * 8 + 2 * t + 1][g] = c[j][1];
        part[warp][j * 8 + 2 * t][g + 8] = c[j][2];
        part[warp][j * 8 + 2 * t + 1][g + 8] = c[j][3];
    }
    __syncthreads();
    for (int o = threadIdx.x; o < NT * 8 * 16; o += 256) {
        int b = o / 16, r = o % 16;
        if (b >= B || n0 + r >= N) continue;
        float v = 0;
#pragma unroll
        for (int w = 0; w < 8; w++) v += part[w][b][r];
        float *dst = y + (size_t)b * N + n0 + r;
        *dst = acc ? *dst + v : v;
    }
}

/* out[b][h] = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M), f16 for the output product.
 * grid (n_head, B), block HD. */
__global__ void k_attn_combine(const float *part_o, const float *part_ml, int n_split, __half *out)
{
    pdl_enter();
    int h = blockIdx.x, b = blockIdx.y, n_head = gridDim.x, d = threadIdx.x;
    const int64_t r = (int64_t)b * n_head + h;
    out[r * SY_HD + d] = __float2half(ag_combine_one(part_o, part_ml, r, n_split, SY_HD, d));   /* attn_group.h */
}

/* h = silu(gate) * up, f16; gu holds [gate | up] per row */
__global__ void k_swiglu(const float *gu, __half *h, int n_ff, int rows)
{
    pdl_enter();
    size_t n = (size_t)n_ff * rows;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / n_ff, c = i % n_ff;
        float g = gu[r * 2 * n_ff + c], u = gu[r * 2 * n_ff + n_ff + c];
        h[i] = __float2half(g / (1.0f + __expf(-g)) * u);
    }
}

/* greedy token per row, its embedding row as the next input, and the position advanced */
__global__ void k_sample_embed(const float *logits, int n_vocab, const __half *emb, int d, float *x, int *tok,
                               int *pos)
{
    pdl_enter();
    int t = block_argmax(logits + (size_t)blockIdx.x * n_vocab, n_vocab);
    if (threadIdx.x == 0) tok[blockIdx.x] = t;
    for (int i = threadIdx.x; i < d; i += blockDim.x) x[(size_t)blockIdx.x * d + i] = __half2float(emb[(size_t)t * d + i]);
    __syncthreads();
    if (threadIdx.x == 0) pos[blockIdx.x]++;
}

/* The summaries of a cache filled without decoding: key sums and min/max of every full page.
 * grid (pages, n_kv, n_layer), block HD. */
__global__ void k_summaries(const __half *K, float *ksum, __half *kmin, __half *kmax, const int *phys_of, int n_kv,
                            int n_layer, int layer, size_t n_phys)
{
    int pg = phys_of[blockIdx.x], kv = blockIdx.y, d = threadIdx.x;
    const __half *k = K + (((size_t)pg * n_kv + kv) * SY_P) * SY_HD + d;
    float s = 0;
    __half lo = k[0], hi = k[0];
    for (int r = 0; r < SY_P; r++) {
        __half v = k[(size_t)r * SY_HD];
        s += __half2float(v);
        lo = __hmin(lo, v), hi = __hmax(hi, v);
    }
    ksum[(((size_t)pg * n_layer + layer) * n_kv + kv) * SY_HD + d] = s;
    size_t mm = (((size_t)layer * n_phys + pg) * n_kv + kv) * SY_HD + d;
    kmin[mm] = lo, kmax[mm] = hi;
}

/* Quest, step 1: the bound sum_i max(q_i min_i, q_i max_i) of every written page (summed over the
 * group's query heads) into bound[b][kv][page]; a warp per page, 8 pages per warp.
 * grid (ceil(pages / 32), n_kv, B), block 128. */
__global__ void __launch_bounds__(128) k_quest_bounds(const float *q, const __half *kmin, const __half *kmax,
                                                      const int *ptab, int pt_stride, const int *pos, int n_kv,
                                                      size_t n_phys, int layer, float *bound, int cap)
{
    pdl_enter();
    int kv = blockIdx.y, b = blockIdx.z, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int n_head = n_kv * SY_G, np = pos[b] / SY_P;   /* candidates: pages before the one being written */
    const float *qg = q + ((size_t)b * n_head + kv * SY_G) * SY_HD;
    float qr[SY_G][4];
#pragma unroll
    for (int g = 0; g < SY_G; g++)
#pragma unroll
        for (int e = 0; e < 4; e++) qr[g][e] = qg[g * SY_HD + lane * 4 + e];
#pragma unroll 4
    for (int j = 0; j < 8; j++) {
        int i = blockIdx.x * 32 + warp * 8 + j;
        if (i >= np) break;
        size_t mm = (((size_t)layer * n_phys + ptab[b * pt_stride + i]) * n_kv + kv) * SY_HD + lane * 4;
        uint2 lo = *(const uint2 *)(kmin + mm), hi = *(const uint2 *)(kmax + mm);
        float2 l0 = __half22float2(*(const __half2 *)&lo.x), l1 = __half22float2(*(const __half2 *)&lo.y);
        float2 h0 = __half22float2(*(const __half2 *)&hi.x), h1 = __half22float2(*(const __half2 *)&hi.y);
        float mn[4] = { l0.x, l0.y, l1.x, l1.y }, mx[4] = { h0.x, h0.y, h1.x, h1.y };
        float u = 0;
#pragma unroll
        for (int g = 0; g < SY_G; g++)
#pragma unroll
            for (int e = 0; e < 4; e++) u += fmaxf(qr[g][e] * mn[e], qr[g][e] * mx[e]);
        for (int o = 16; o > 0; o >>= 1) u += __shfl_xor_sync(0xffffffffu, u, o);
        if (lane == 0) bound[((size_t)b * n_kv + kv) * cap + i] = u;
    }
}

__device__ __forceinline__ unsigned order_key(float v)
{
    unsigned u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);   /* unsigned order = float order */
}

/* Quest, step 2: the k-1 pages of highest bound (ties: lower page first) and the page being written,
 * by a radix select over the bounds' order-preserving keys (4 passes of 8 bits), then a gather.
 * grid (n_kv, B), block 1024. */
__global__ void __launch_bounds__(1024) k_quest_select(const float *bound, const int *pos, int n_kv, int k, int *list,
                                                       int *nlist, int cap)
{
    pdl_enter();
    __shared__ unsigned keys[SY_MAX_PAGES];
    __shared__ int hist[256];
    __shared__ unsigned prefix;
    __shared__ int want, n_out;
    int kv = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
    int cur = pos[b] / SY_P, np = cur;
    int *out = list + ((size_t)b * n_kv + kv) * cap;
    if (np <= k - 1) {
        for (int i = tid; i <= cur; i += blockDim.x) out[i] = i;
        if (tid == 0) nlist[b * n_kv + kv] = cur + 1;
        return;
    }
    const float *bd = bound + ((size_t)b * n_kv + kv) * cap;
    for (int i = tid; i < np; i += blockDim.x) keys[i] = order_key(bd[i]);
    if (tid == 0) prefix = 0, want = k - 1, n_out = 0;
    /* the (k-1)-th largest key, 8 bits at a time from the top */
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        unsigned pre = prefix, mask = shift == 24 ? 0u : ~0u << (shift + 8);
        for (int i = tid; i < np; i += blockDim.x)
            if ((keys[i] & mask) == pre) atomicAdd(&hist[(keys[i] >> shift) & 255], 1);
        __syncthreads();
        if (tid == 0) {
            int w = want, dgt = 255;
            for (; dgt > 0 && hist[dgt] < w; dgt--) w -= hist[dgt];
            want = w;
            prefix = pre | ((unsigned)dgt << shift);
        }
        __syncthreads();
    }
    unsigned T = prefix;
    int take_eq = want;   /* how many of the keys equal to T to take, lowest pages first */
    for (int i = tid; i < np; i += blockDim.x)
        if (keys[i] > T) out[atomicAdd(&n_out, 1)] = i;
    __syncthreads();
    if (tid < 32) {   /* one warp walks the ties in page order */
        int base = n_out, taken = 0;
        for (int i0 = 0; i0 < np && taken < take_eq; i0 += 32) {
            int i = i0 + tid;
            bool eq = i < np && keys[i] == T;
            unsigned ball = __ballot_sync(0xffffffffu, eq);
            int before = __popc(ball & ((1u << tid) - 1));
            if (eq && taken + before < take_eq) out[base + taken + before] = i;
            taken += __popc(ball);
        }
    }
    if (tid == 0) {
        out[k - 1] = cur;
        nlist[b * n_kv + kv] = k;
    }
}

/* CHESS rebuild, step 1: the rows to score (page rows = mean key of each candidate page over all
 * layers and KV heads; chunk rows = mean of their pages' rows; grid rows = mean of their chunks'),
 * and the anchor (mean row of the window pages [last, np), the partial page by its own count).
 * One sequence (b) at a time; rows [n_cand + nc + ng + 1][dim], the anchor last. */
__global__ void k_chess_rows(const float *ksum, const int *ptab, int pt_stride, const int *pos, int b, int first,
                             int n_cand, int nc, int ng, int last, int np, int dim, float *R)
{
    int n_rows = n_cand + nc + ng + 1;
    int len = pos[b];
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < (size_t)n_rows * dim;
         e += (size_t)gridDim.x * blockDim.x) {
        int r = (int)(e / dim), d = (int)(e % dim);
        float v = 0;
        if (r < n_cand) {
            v = ksum[(size_t)ptab[b * pt_stride + first + r] * dim + d] / (float)SY_P;
        } else if (r < n_cand + nc) {
            int c = r - n_cand, p0 = c * CHESS_CHUNK, p1 = min(p0 + CHESS_CHUNK, n_cand);
            for (int p = p0; p < p1; p++) v += ksum[(size_t)ptab[b * pt_stride + first + p] * dim + d];
            v /= (float)((p1 - p0) * SY_P);
        } else if (r < n_cand + nc + ng) {
            int g = r - n_cand - nc, c0 = g * CHESS_GRID, c1 = min(c0 + CHESS_GRID, nc);
            for (int c = c0; c < c1; c++) {
                int p0 = c * CHESS_CHUNK, p1 = min(p0 + CHESS_CHUNK, n_cand);
                float s = 0;
                for (int p = p0; p < p1; p++) s += ksum[(size_t)ptab[b * pt_stride + first + p] * dim + d];
                v += s / (float)((p1 - p0) * SY_P);
            }
            v /= (float)(c1 - c0);
        } else {
            for (int p = last; p < np; p++) {
                int cnt = min(SY_P, len - p * SY_P);
                if (cnt > 0) v += ksum[(size_t)ptab[b * pt_stride + p] * dim + d] / (float)cnt;
            }
            v /= (float)(np - last);
        }
        R[e] = v;
    }
}

/* step 2: cosine of each row with the anchor (the last row); scores of sequence b.
 * grid (rows), block 256. */
__global__ void k_chess_score(const float *R, int n_rows, int dim, int b, float *score)
{
    __shared__ float red[32];
    int r = blockIdx.x;
    const float *row = R + (size_t)r * dim, *an = R + (size_t)n_rows * dim;
    float dot = 0, nn = 0;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) dot += row[d] * an[d], nn += row[d] * row[d];
    dot = block_sum(dot, red);
    nn = block_sum(nn, red);
    if (threadIdx.x == 0) score[(size_t)b * (n_rows + 1) + r] = nn > 0 ? dot * rsqrtf(nn) : 0.0f;
}

/* top `keep` of cand[0..n) by score (ties: lower index first), in place, by rank */
__device__ int top_by_rank(int *cand, int n, const float *score, int keep, int *tmp)
{
    for (int i = threadIdx.x; i < n; i += blockDim.x) tmp[i] = cand[i];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        int ci = tmp[i], rank = 0;
        float si = score[ci];
        for (int j = 0; j < n; j++) {
            float sj = score[tmp[j]];
            rank += sj > si || (sj == si && tmp[j] < ci);
        }
        if (rank < keep) cand[rank] = ci;
    }
    __syncthreads();
    return keep;
}

__device__ __forceinline__ int ceil_frac(double f, int n)
{
    int k = (int)ceil(f * (double)n - 1e-9);   /* as engine/policy/chess.c */
    if (k < 1 && n > 0) k = 1;
    return k > n ? n : k;
}

/* step 3: grids, then chunks inside them, then pages inside those; the list is sink + selected + every
 * page from the window on (up to the last page the timed steps will write). grid (B), block 1024. */
__global__ void __launch_bounds__(1024) k_chess_select(const float *score, int n_cand, int nc, int ng, int first,
                                                       int tail_from, int end_page, int n_kv, int *list, int *nlist,
                                                       int cap)
{
    __shared__ int a[SY_MAX_PAGES], t[SY_MAX_PAGES];
    __shared__ int n_out;
    int b = blockIdx.x;
    const float *S = score + (size_t)b * (n_cand + nc + ng + 1);
    const float *ps = S, *cs = S + n_cand, *gs = cs + nc;
    for (int i = threadIdx.x; i < ng; i += blockDim.x) a[i] = i;
    __syncthreads();
    int kg = top_by_rank(a, ng, gs, ceil_frac(chess_rho_dev(0), ng), t);
    /* chunks of the kept grids */
    __shared__ int n2;
    if (threadIdx.x == 0) {
        n2 = 0;
        for (int i = 0; i < kg; i++)
            for (int c = a[i] * CHESS_GRID; c < (a[i] + 1) * CHESS_GRID && c < nc; c++) t[n2++] = c;
    }
    __syncthreads();
    int m2 = n2;
    for (int i = threadIdx.x; i < m2; i += blockDim.x) a[i] = t[i];
    __syncthreads();
    int kc = top_by_rank(a, m2, cs, ceil_frac(chess_rho_dev(1), m2), t);
    __shared__ int n3;
    if (threadIdx.x == 0) {
        n3 = 0;
        for (int i = 0; i < kc; i++)
            for (int p = a[i] * CHESS_CHUNK; p < (a[i] + 1) * CHESS_CHUNK && p < n_cand; p++) t[n3++] = p;
    }
    __syncthreads();
    int m3 = n3;
    for (int i = threadIdx.x; i < m3; i += blockDim.x) a[i] = t[i];
    __syncthreads();
    int kp = top_by_rank(a, m3, ps, ceil_frac(chess_rho_dev(2), m3), t);
    if (threadIdx.x == 0) {
        int *out = list + (size_t)b * n_kv * cap, n = 0;
        for (int i = 0; i < CHESS_SINK && i < first + n_cand; i++) out[n++] = i;
        for (int i = 0; i < kp; i++) out[n++] = first + a[i];
        for (int p = tail_from; p <= end_page; p++) out[n++] = p;
        n_out = n;
        for (int h = 0; h < n_kv; h++) nlist[b * n_kv + h] = n;
    }
    __syncthreads();
    for (int h = 1; h < n_kv; h++)
        for (int i = threadIdx.x; i < n_out; i += blockDim.x) list[((size_t)b * n_kv + h) * cap + i] = list[(size_t)b * n_kv * cap + i];
}

/* ---------------------------------------------------------------- the model and one case */

typedef struct sy_case {
    int B, ctx0, gen, pps;             /* sequences, tokens cached at the start, steps, pages per sequence */
    size_t n_phys;
    int *ptab, *pos, *tok, *list, *nlist;
    float *qbound;                     /* Quest: every page's bound, [B][kv][page] */
    float *ksum, *x, *qkv, *q, *gu, *logits, *part_o, *part_ml, *rows, *score;
    __half *kmin, *kmax, *xn, *att, *h;
    int n_split, quest_k;
    int max_split, n_sm;               /* the partials are sized for max_split */
} sy_case;

void *sy_dalloc(size_t bytes, sy_err *E, const char *what)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaGetLastError();
        cudaMemGetInfo(&fr, &tot);
        if (!E->failed)
            snprintf(E->buf, E->len, "out of GPU memory: %s needs %.2f GiB, %.2f GiB of %.2f GiB free", what,
                     bytes / 1073741824.0, fr / 1073741824.0, tot / 1073741824.0);
        E->failed = 1;
        return NULL;
    }
    return p;
}


static int model_make(sy_model *m, const synth_shape *s, sy_err *E)
{
    memset(m, 0, sizeof *m);
    m->s = s;
    size_t d = (size_t)s->n_embd, hd = (size_t)s->head_dim;
    size_t n_qkv = (size_t)(s->n_head + 2 * s->n_head_kv) * hd, ff = (size_t)s->n_ff;
    size_t ve = (size_t)s->n_vocab * d;
    m->L = (sy_layer *)calloc((size_t)s->n_layer, sizeof(sy_layer));
    if (!m->L) {
        snprintf(E->buf, E->len, "out of memory");
        return -1;
    }
    uint64_t seed = 0x5eed;
    CK(cudaStreamCreate(&m->st), "stream");
    CKB(cublasCreate(&m->blas), "cublasCreate");
    CKB(cublasSetStream(m->blas, m->st), "cublasSetStream");
    /* a workspace of its own, so that the products can be captured in a graph */
    if (!(m->blas_ws = sy_dalloc(64u << 20, E, "the cuBLAS workspace"))) goto fail;
    CKB(cublasSetWorkspace(m->blas, m->blas_ws, 64u << 20), "cublasSetWorkspace");
    for (int l = 0; l < s->n_layer; l++) {
        sy_layer *y = &m->L[l];
        struct { __half **p; size_t n, in; } w[4] = { { &y->wqkv, n_qkv * d, d }, { &y->wo, d * (size_t)s->n_head * hd, (size_t)s->n_head * hd },
                                                     { &y->wgu, 2 * ff * d, d }, { &y->wdown, d * ff, ff } };
        for (int i = 0; i < 4; i++) {
            if (!(*w[i].p = (__half *)sy_dalloc(w[i].n * 2, E, "the synthetic weights"))) goto fail;
            /* uniform with the variance 1/n_in keeps the activations at unit scale */
            k_fill_half<<<grid_for(w[i].n), 256, 0, m->st>>>(*w[i].p, w[i].n, seed++, sqrtf(3.0f / (float)w[i].in));
            CK(cudaGetLastError(), "fill");
            m->weight_bytes += (double)w[i].n * 2;
        }
        if (!(y->attn_norm = (float *)sy_dalloc(d * 4, E, "norms")) || !(y->ffn_norm = (float *)sy_dalloc(d * 4, E, "norms")))
            goto fail;
        k_fill_f32<<<grid_for(d), 256, 0, m->st>>>(y->attn_norm, d, 1.0f);
        k_fill_f32<<<grid_for(d), 256, 0, m->st>>>(y->ffn_norm, d, 1.0f);
        m->weight_bytes += 2.0 * d * 4;
    }
    if (!(m->emb = (__half *)sy_dalloc(ve * 2, E, "the embedding")) || !(m->out = (__half *)sy_dalloc(ve * 2, E, "the output matrix")) ||
        !(m->out_norm = (float *)sy_dalloc(d * 4, E, "norms")))
        goto fail;
    k_fill_half<<<grid_for(ve), 256, 0, m->st>>>(m->emb, ve, seed++, 1.0f);
    k_fill_half<<<grid_for(ve), 256, 0, m->st>>>(m->out, ve, seed++, sqrtf(3.0f / (float)d));
    k_fill_f32<<<grid_for(d), 256, 0, m->st>>>(m->out_norm, d, 1.0f);
    m->weight_bytes += (double)ve * 2 + d * 4;
    CK(cudaStreamSynchronize(m->st), "making the weights");
    return 0;
fail:
    return -1;
}

static void model_free(sy_model *m)
{
    if (m->L)
        for (int l = 0; l < m->s->n_layer; l++) {
            sy_layer *y = &m->L[l];
            cudaFree(y->wqkv), cudaFree(y->wo), cudaFree(y->wgu), cudaFree(y->wdown);
            cudaFree(y->attn_norm), cudaFree(y->ffn_norm);
        }
    free(m->L);
    for (int i = 0; i < 1024; i++)
        if (m->prof_ev[i]) cudaEventDestroy(m->prof_ev[i]);
    cudaFree(m->emb), cudaFree(m->out), cudaFree(m->out_norm), cudaFree(m->blas_ws);
    if (m->blas) cublasDestroy(m->blas);
    if (m->st) cudaStreamDestroy(m->st);
}

/* bytes a case allocates: the KV pages, their summaries, the CHESS scoring rows, the activations */
static double case_bytes(const synth_shape *s, int B, int ctx, int n_split)
{
    double pps = (ctx + SY_P - 1) / SY_P + 1, phys = pps * B, kvd = (double)s->n_head_kv * s->head_dim;
    double kv = 2.0 * s->n_layer * phys * SY_P * kvd * 2;
    double sums = phys * s->n_layer * kvd * 4 + 2.0 * s->n_layer * phys * kvd * 2;
    double nc = (pps + CHESS_CHUNK - 1) / CHESS_CHUNK, rows = (pps + nc + nc / CHESS_GRID + 2) * s->n_layer * kvd * 4;
    double act = (double)B * (s->n_embd * 16.0 + s->n_ff * 12.0 + s->n_vocab * 4.0) +
                 (double)B * s->n_head * n_split * (s->head_dim + 2) * 4.0 + 2.0 * B * s->n_head_kv * pps * 4;
    return kv + sums + rows + act;
}

static void case_free(sy_case *c, sy_model *m)
{
    for (int l = 0; l < m->s->n_layer; l++) cudaFree(m->L[l].K), cudaFree(m->L[l].V), m->L[l].K = m->L[l].V = NULL;
    void *p[] = { c->ptab, c->pos, c->tok, c->list, c->nlist, c->ksum, c->x, c->qkv, c->q, c->gu, c->logits,
                  c->part_o, c->part_ml, c->rows, c->score, c->qbound, c->kmin, c->kmax, c->xn, c->att, c->h };
    for (size_t i = 0; i < sizeof p / sizeof *p; i++) cudaFree(p[i]);
    memset(c, 0, sizeof *c);
}

/* Allocates a case and fills its cache: random keys and values in the first ctx0 positions of every
 * sequence, the summaries made from them, the first tokens' embedding rows as the input. */
static int case_make(sy_case *c, sy_model *m, int B, int ctx0, int gen, int n_split, sy_err *E)
{
    const synth_shape *s = m->s;
    memset(c, 0, sizeof *c);
    c->B = B, c->ctx0 = ctx0, c->gen = gen, c->n_split = c->max_split = n_split;
    c->pps = (ctx0 + gen + SY_P - 1) / SY_P + 1;
    c->n_phys = (size_t)c->pps * B;
    size_t kvd = (size_t)s->n_head_kv * SY_HD, page = (size_t)SY_P * kvd, d = (size_t)s->n_embd;
    size_t dim = (size_t)s->n_layer * kvd;
    int nc = (c->pps + CHESS_CHUNK - 1) / CHESS_CHUNK, ng = (nc + CHESS_GRID - 1) / CHESS_GRID;
    size_t n_rows = (size_t)c->pps + nc + ng + 1;
    int *ptab = NULL, *pos = NULL;
    for (int l = 0; l < s->n_layer; l++)
        if (!(m->L[l].K = (__half *)sy_dalloc(c->n_phys * page * 2, E, "the KV pages")) ||
            !(m->L[l].V = (__half *)sy_dalloc(c->n_phys * page * 2, E, "the KV pages")))
            goto fail;
#define A(field, T, n, what) if (!(c->field = (T *)sy_dalloc((size_t)(n) * sizeof(T), E, what))) goto fail
    A(ptab, int, c->n_phys, "the page table");
    A(pos, int, B, "positions");
    A(tok, int, B, "tokens");
    A(list, int, (size_t)B * s->n_head_kv * c->pps, "page lists");
    A(nlist, int, (size_t)B * s->n_head_kv, "page lists");
    A(ksum, float, c->n_phys * dim, "the CHESS summaries");
    A(kmin, __half, (size_t)s->n_layer * c->n_phys * kvd, "the Quest bounds");
    A(kmax, __half, (size_t)s->n_layer * c->n_phys * kvd, "the Quest bounds");
    A(x, float, (size_t)B * d, "activations");
    A(xn, __half, (size_t)B * (d > (size_t)s->n_head * SY_HD ? d : (size_t)s->n_head * SY_HD), "activations");
    A(qkv, float, (size_t)B * (s->n_head + 2 * s->n_head_kv) * SY_HD, "activations");
    A(q, float, (size_t)B * s->n_head * SY_HD, "activations");
    A(att, __half, (size_t)B * s->n_head * SY_HD, "activations");
    A(gu, float, (size_t)B * 2 * s->n_ff, "activations");
    A(h, __half, (size_t)B * s->n_ff, "activations");
    A(logits, float, (size_t)B * s->n_vocab, "logits");
    A(part_o, float, (size_t)B * s->n_head * n_split * SY_HD, "attention partials");
    A(part_ml, float, (size_t)B * s->n_head * n_split * 2, "attention partials");
    A(rows, float, n_rows * dim, "the CHESS scoring rows");
    A(score, float, (size_t)B * n_rows, "the CHESS scores");
    A(qbound, float, (size_t)B * s->n_head_kv * c->pps, "the Quest bounds");
#undef A
    /* pages of the sequences interleaved in the pool, as a shared allocator would leave them */
    ptab = (int *)malloc(sizeof(int) * c->n_phys);
    pos = (int *)malloc(sizeof(int) * B);
    if (!ptab || !pos) {
        snprintf(E->buf, E->len, "out of memory");
        E->failed = 1;
        goto fail;
    }
    for (int b = 0; b < B; b++) {
        pos[b] = ctx0;
        for (int j = 0; j < c->pps; j++) ptab[b * c->pps + j] = j * B + b;
    }
    CK(cudaMemcpy(c->ptab, ptab, sizeof(int) * c->n_phys, cudaMemcpyHostToDevice), "page table");
    CK(cudaMemcpy(c->pos, pos, sizeof(int) * B, cudaMemcpyHostToDevice), "positions");
    for (int l = 0; l < s->n_layer; l++) {
        k_fill_half<<<grid_for(c->n_phys * page), 256, 0, m->st>>>(m->L[l].K, c->n_phys * page, 1000 + l, 1.0f);
        k_fill_half<<<grid_for(c->n_phys * page), 256, 0, m->st>>>(m->L[l].V, c->n_phys * page, 2000 + l, 1.0f);
        k_summaries<<<dim3((unsigned)c->n_phys, s->n_head_kv), SY_HD, 0, m->st>>>(m->L[l].K, c->ksum, c->kmin, c->kmax, c->ptab,
                                                                              s->n_head_kv, s->n_layer, l, c->n_phys);
        CK(cudaGetLastError(), "filling the cache");
    }
    k_fill_half<<<grid_for((size_t)B * d), 256, 0, m->st>>>(c->xn, (size_t)B * d, 7, 1.0f);
    k_fill_f32<<<grid_for((size_t)B * d), 256, 0, m->st>>>(c->x, (size_t)B * d, 0.5f);
    CK(cudaStreamSynchronize(m->st), "filling the cache");
    free(ptab);
    free(pos);
    return 0;
fail:
    free(ptab);
    free(pos);
    return -1;
}

cublasStatus_t sy_gemm(sy_model *m, const __half *W, int n_out, int n_in, const __half *x, int B, float *y, int acc)
{
    const float one = 1.0f, zero = 0.0f;
    /* Measured on an H100 and an H200 (docs/gpu.md): batches 1-2 fastest through the one-pass kernel,
     * 3-4 through the tensor-core pass, 5 and more through cuBLAS (the tensor-core pass reloads x per
     * 16 rows, which costs more than it saves from there on). SYNTH_GEMM_TC takes it for 1..32. */
    if (m->gemm != SYNTH_GEMM_CUBLAS && B <= 32 && n_in % 64 == 0 && (m->gemm == SYNTH_GEMM_TC || B >= 3) &&
        (m->gemm == SYNTH_GEMM_TC || B <= 4)) {
        unsigned g = (unsigned)((n_out + 15) / 16);
        cudaError_t e;
        switch ((B + 7) / 8) {
        case 1: e = launch(m, g, 256, 0, k_gemm_tc<1>, W, x, y, n_out, n_in, B, acc); break;
        case 2: e = launch(m, g, 256, 0, k_gemm_tc<2>, W, x, y, n_out, n_in, B, acc); break;
        case 3: e = launch(m, g, 256, 0, k_gemm_tc<3>, W, x, y, n_out, n_in, B, acc); break;
        default: e = launch(m, g, 256, 0, k_gemm_tc<4>, W, x, y, n_out, n_in, B, acc); break;
        }
        return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
    }
    if (B <= 4 && n_in % 8 == 0 && m->gemm == SYNTH_GEMM_OWN) {
        unsigned g = (unsigned)((n_out + 3) / 4);
        cudaError_t e;
        switch (B) {
        case 1: e = launch(m, g, 256, 0, k_gemv<1>, W, x, y, n_out, n_in, acc); break;
        case 2: e = launch(m, g, 256, 0, k_gemv<2>, W, x, y, n_out, n_in, acc); break;
        case 3: e = launch(m, g, 256, 0, k_gemv<3>, W, x, y, n_out, n_in, acc); break;
        default: e = launch(m, g, 256, 0, k_gemv<4>, W, x, y, n_out, n_in, acc); break;
        }
        return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
    }
    return cublasGemmEx(m->blas, CUBLAS_OP_T, CUBLAS_OP_N, n_out, B, n_in, &one, W, CUDA_R_16F, n_in, x, CUDA_R_16F, n_in,
                        acc ? &one : &zero, y, CUDA_R_32F, n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

enum { PROF_PRODUCTS, PROF_ATTENTION, PROF_SELECTION, PROF_OTHER };

/* the launch just enqueued ends a profiled segment of category cat */
static void prof_mark(sy_model *m, int cat)
{
    if (!m->profiling || m->prof_n >= 1024) return;
    if (!m->prof_ev[m->prof_n]) cudaEventCreate(&m->prof_ev[m->prof_n]);
    cudaEventRecord(m->prof_ev[m->prof_n], m->st);
    m->prof_cat[m->prof_n++] = cat;
}

/* One decode step of the batch, enqueued on the model's stream (captured into a graph by the caller). */
static int enqueue_step(sy_model *m, sy_case *c, int policy, sy_err *E)
{
    m->prof_n = 0;
    prof_mark(m, PROF_OTHER);
    const synth_shape *s = m->s;
    int B = c->B, d = s->n_embd, nh = s->n_head, nkv = s->n_head_kv, ff = s->n_ff;
    int n_qkv = (nh + 2 * nkv) * SY_HD;
    float scale = 1.0f / sqrtf((float)SY_HD);
    for (int l = 0; l < s->n_layer; l++) {
        sy_layer *y = &m->L[l];
        CK(launch(m, B, 256, 0, k_rmsnorm, c->x, y->attn_norm, c->xn, d, 1e-5f), "norm");
        prof_mark(m, PROF_OTHER);
        CKB(sy_gemm(m, y->wqkv, n_qkv, d, c->xn, B, c->qkv, 0), "QKV product");
        prof_mark(m, PROF_PRODUCTS);
        CK(launch(m, dim3(nh + nkv, B), SY_HD / 2, 0, k_rope_write, c->qkv, c->q, y->K, y->V, c->ksum, c->kmin, c->kmax, c->pos,
                  c->ptab, c->pps, nh, nkv, s->n_layer, l, c->n_phys, s->rope_base),
           "RoPE and the page writes");
        prof_mark(m, PROF_OTHER);
        if (policy == SYNTH_QUEST) {
            CK(launch(m, dim3((c->pps + 31) / 32, nkv, B), 128, 0, k_quest_bounds, c->q, c->kmin, c->kmax, c->ptab, c->pps, c->pos,
                      nkv, c->n_phys, l, c->qbound, c->pps),
               "Quest bounds");
            CK(launch(m, dim3(nkv, B), 1024, 0, k_quest_select, c->qbound, c->pos, nkv, c->quest_k, c->list, c->nlist, c->pps),
               "Quest selection");
        }
        prof_mark(m, PROF_SELECTION);
        CK(launch(m, dim3(c->n_split, nkv, B), 32, TC_SMEM, k_attn, c->q, y->K, y->V, c->ptab, c->pps, c->list, c->nlist, c->pps,
                  c->pos, nkv, c->n_split, scale, c->part_o, c->part_ml),
           "attention");
        CK(launch(m, dim3(nh, B), SY_HD, 0, k_attn_combine, c->part_o, c->part_ml, c->n_split, c->att), "attention");
        prof_mark(m, PROF_ATTENTION);
        CKB(sy_gemm(m, y->wo, d, nh * SY_HD, c->att, B, c->x, 1), "output product");
        prof_mark(m, PROF_PRODUCTS);
        CK(launch(m, B, 256, 0, k_rmsnorm, c->x, y->ffn_norm, c->xn, d, 1e-5f), "norm");
        prof_mark(m, PROF_OTHER);
        CKB(sy_gemm(m, y->wgu, 2 * ff, d, c->xn, B, c->gu, 0), "gate/up product");
        prof_mark(m, PROF_PRODUCTS);
        CK(launch(m, grid_for((size_t)B * ff), 256, 0, k_swiglu, c->gu, c->h, ff, B), "SwiGLU");
        prof_mark(m, PROF_OTHER);
        CKB(sy_gemm(m, y->wdown, d, ff, c->h, B, c->x, 1), "down product");
        prof_mark(m, PROF_PRODUCTS);
        CK(cudaGetLastError(), "a decode kernel");
    }
    CK(launch(m, B, 256, 0, k_rmsnorm, c->x, m->out_norm, c->xn, d, 1e-5f), "norm");
    prof_mark(m, PROF_OTHER);
    CKB(sy_gemm(m, m->out, s->n_vocab, d, c->xn, B, c->logits, 0), "output matrix");
    prof_mark(m, PROF_PRODUCTS);
    CK(launch(m, B, 1024, 0, k_sample_embed, c->logits, s->n_vocab, m->emb, d, c->x, c->tok, c->pos), "sampling");
    prof_mark(m, PROF_OTHER);
    CK(cudaGetLastError(), "sampling");
    return 0;
fail:
    return -1;
}

/* full: every page of every sequence, for every KV head */
static int lists_full(sy_model *m, sy_case *c, sy_err *E)
{
    int nkv = m->s->n_head_kv, n = c->pps;
    size_t tot = (size_t)c->B * nkv * n;
    int *l = (int *)malloc(sizeof(int) * tot), *nl = (int *)malloc(sizeof(int) * (size_t)c->B * nkv);
    if (!l || !nl) {
        free(l), free(nl);
        snprintf(E->buf, E->len, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < tot; i++) l[i] = (int)(i % n);
    for (int i = 0; i < c->B * nkv; i++) nl[i] = n;
    CK(cudaMemcpy(c->list, l, sizeof(int) * tot, cudaMemcpyHostToDevice), "page lists");
    CK(cudaMemcpy(c->nlist, nl, sizeof(int) * (size_t)c->B * nkv, cudaMemcpyHostToDevice), "page lists");
    free(l), free(nl);
    return 0;
fail:
    free(l), free(nl);
    return -1;
}

/* CHESS's reconstruction at the current position (all sequences are at the same one); *n_sel: the
 * pages the list holds for the first sequence */
static int chess_rebuild(sy_model *m, sy_case *c, int cur_len, int *n_list, sy_err *E)
{
    const synth_shape *s = m->s;
    int dim = s->n_layer * s->n_head_kv * SY_HD;
    int np = (cur_len + SY_P - 1) / SY_P;
    int nw = CHESS_WINDOW < np ? CHESS_WINDOW : np;
    int first = CHESS_SINK, last = np - nw, n_cand = last > first ? last - first : 0;
    int tail_from = last > first ? last : first;
    int nc = (n_cand + CHESS_CHUNK - 1) / CHESS_CHUNK, ng = (nc + CHESS_GRID - 1) / CHESS_GRID;
    int n_rows = n_cand + nc + ng;
    int end_page = (c->ctx0 + c->gen) / SY_P;
    for (int b = 0; b < c->B; b++) {
        k_chess_rows<<<1024, 256, 0, m->st>>>(c->ksum, c->ptab, c->pps, c->pos, b, first, n_cand, nc, ng, last, np, dim, c->rows);
        k_chess_score<<<n_rows, 256, 0, m->st>>>(c->rows, n_rows, dim, b, c->score);
    }
    k_chess_select<<<c->B, 1024, 0, m->st>>>(c->score, n_cand, nc, ng, first, tail_from, end_page, s->n_head_kv, c->list, c->nlist,
                                             c->pps);
    CK(cudaGetLastError(), "CHESS selection");
    CK(cudaMemcpyAsync(n_list, c->nlist, sizeof(int), cudaMemcpyDeviceToHost, m->st), "CHESS selection");
    CK(cudaStreamSynchronize(m->st), "CHESS selection");
    return 0;
fail:
    return -1;
}

/* ---------------------------------------------------------------- measuring */

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* device-to-device copy bandwidth, bytes read + written per second (median of 15) */
static double measure_bandwidth(sy_model *m, sy_err *E)
{
    size_t n = (size_t)2 << 30;
    void *a = sy_dalloc(n, E, "the bandwidth probe"), *b = a ? sy_dalloc(n, E, "the bandwidth probe") : NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float t[15], med = 0;
    if (!b) goto fail;
    k_fill_half<<<grid_for(n / 2), 256, 0, m->st>>>((__half *)a, n / 2, 99, 1.0f);
    CK(cudaEventCreate(&e0), "event");
    CK(cudaEventCreate(&e1), "event");
    for (int i = -3; i < 15; i++) {
        CK(cudaEventRecord(e0, m->st), "event");
        CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, m->st), "bandwidth probe");
        CK(cudaEventRecord(e1, m->st), "event");
        CK(cudaEventSynchronize(e1), "event");
        if (i >= 0) CK(cudaEventElapsedTime(&t[i], e0, e1), "event");
    }
    qsort(t, 15, sizeof *t, cmp_float);
    med = t[7];
fail:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a), cudaFree(b);
    return med > 0 ? 2.0 * (double)n / (med * 1e-3) : -1;
}

double sy_used_gib(void)
{
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    return (double)(tot - fr) / 1073741824.0;
}

/* the split count: two waves of one-warp blocks (about 4 fit on a multiprocessor beside their
 * 48 KiB of stages), at least 2 pages each */
static int split_for(int B, int nkv, int max_list, int n_sm)
{
    int want = (8 * n_sm + B * nkv - 1) / (B * nkv), most = max_list / 2 > 1 ? max_list / 2 : 1;
    return want < 1 ? 1 : want > most ? most : want;
}

/* Times one policy on a made case: graph capture, warm-up, `gen` timed replays (median). */
static int run_policy(sy_model *m, sy_case *c, int policy, double bw, const synth_req *req, synth_row *r, sy_err *E)
{
    const synth_shape *s = m->s;
    int B = c->B, nkv = s->n_head_kv;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float *t = (float *)malloc(sizeof(float) * (size_t)c->gen);
    int *pos0 = (int *)malloc(sizeof(int) * (size_t)B);
    int n_list = 0, ok = -1;
    double len_mid = c->ctx0 + c->gen / 2.0;   /* the mean length over the timed steps */
    double kvd = (double)nkv * SY_HD, kv_tok_bytes = 2.0 * kvd * 2 * s->n_layer;
    double attended = 0, extra = 0;
    if (!t || !pos0) {
        snprintf(E->buf, E->len, "out of memory");
        goto fail;
    }
    for (int b = 0; b < B; b++) pos0[b] = c->ctx0;
    CK(cudaMemcpy(c->pos, pos0, sizeof(int) * (size_t)B, cudaMemcpyHostToDevice), "positions");
    CK(cudaEventCreate(&e0), "event");
    CK(cudaEventCreate(&e1), "event");
    r->select_ms = 0;
    if (policy == SYNTH_FULL) {
        if (lists_full(m, c, E)) goto fail;
        attended = len_mid;
    } else if (policy == SYNTH_CHESS) {
        /* the rebuild, timed on its own (median of 5), then amortised over its period */
        float rt[5];
        for (int i = 0; i < 5; i++) {
            CK(cudaEventRecord(e0, m->st), "event");
            if (chess_rebuild(m, c, c->ctx0, &n_list, E)) goto fail;
            CK(cudaEventRecord(e1, m->st), "event");
            CK(cudaEventSynchronize(e1), "event");
            CK(cudaEventElapsedTime(&rt[i], e0, e1), "event");
        }
        qsort(rt, 5, sizeof *rt, cmp_float);
        r->select_ms = rt[2];
        int np = (c->ctx0 + SY_P - 1) / SY_P, tail_from = np - CHESS_WINDOW;
        int fixed = n_list - ((c->ctx0 + c->gen) / SY_P - tail_from + 1);   /* sink + selected pages */
        attended = fixed * (double)SY_P + (len_mid - tail_from * (double)SY_P);
        /* the rebuild reads every page's key sums once: its floor, amortised */
        extra = (double)B * np * s->n_layer * kvd * 4 / (CHESS_EVERY * SY_P);
    } else {
        c->quest_k = (req->quest_budget + SY_P - 1) / SY_P;
        double cur = len_mid / SY_P;
        attended = (c->quest_k - 1 < cur ? c->quest_k - 1 : cur) * SY_P + SY_P / 2.0;
        extra = (double)B * s->n_layer * cur * 2 * kvd * 2;   /* every page's min and max key */
    }
    {   /* the split of this policy's lists */
        int list_len = policy == SYNTH_FULL ? c->pps : policy == SYNTH_CHESS ? n_list : c->quest_k;
        c->n_split = split_for(B, nkv, list_len, c->n_sm);
        if (c->n_split > c->max_split) c->n_split = c->max_split;
    }
    CK(cudaStreamBeginCapture(m->st, cudaStreamCaptureModeThreadLocal), "graph capture");
    if (enqueue_step(m, c, policy, E)) {
        cudaStreamEndCapture(m->st, &graph);
        goto fail;
    }
    CK(cudaStreamEndCapture(m->st, &graph), "graph capture");
    CK(cudaGraphInstantiate(&exec, graph, 0), "graph instantiation");
    for (int i = 0; i < 3; i++) CK(cudaGraphLaunch(exec, m->st), "graph launch");   /* warm-up */
    CK(cudaStreamSynchronize(m->st), "warm-up");
    CK(cudaMemcpy(c->pos, pos0, sizeof(int) * (size_t)B, cudaMemcpyHostToDevice), "positions");
    for (int i = 0; i < c->gen; i++) {
        CK(cudaEventRecord(e0, m->st), "event");
        CK(cudaGraphLaunch(exec, m->st), "graph launch");
        CK(cudaEventRecord(e1, m->st), "event");
        CK(cudaEventSynchronize(e1), "event");
        CK(cudaEventElapsedTime(&t[i], e0, e1), "event");
    }
    if (getenv("KVCHAT_SYNTH_PROFILE")) {   /* one step outside the graph, an event after every launch */
        m->profiling = 1;
        int prc = enqueue_step(m, c, policy, E);
        m->profiling = 0;
        if (prc) goto fail;
        CK(cudaStreamSynchronize(m->st), "profiled step");
        memset(r->prof_ms, 0, sizeof r->prof_ms);
        for (int i = 1; i < m->prof_n; i++) {
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, m->prof_ev[i - 1], m->prof_ev[i]), "event");
            r->prof_ms[m->prof_cat[i]] += ms;
        }
        r->prof_kernels = m->prof_n - 1;
    }
    qsort(t, (size_t)c->gen, sizeof *t, cmp_float);
    r->step_ms = t[c->gen / 2] + r->select_ms / (CHESS_EVERY * SY_P);
    r->tok_s = B / (r->step_ms * 1e-3);
    r->bytes_step = m->weight_bytes + (double)B * s->n_embd * 2 + 2.0 * B * s->n_vocab * 4 + B * attended * kv_tok_bytes + extra;
    r->roof_ms = r->bytes_step / bw * 1e3;
    r->kv_frac = attended / len_mid;
    r->peak_gib = sy_used_gib();
    ok = 0;
fail:
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    free(t), free(pos0);
    return ok;
}

/* ---------------------------------------------------------------- self-check */

/* the decode products checked: (batch, SYNTH_GEMM_*, K): every kernel and template of sy_gemm */
static const int gemm_cases[][3] = { { 1, SYNTH_GEMM_OWN, 264 },  { 2, SYNTH_GEMM_OWN, 264 },  { 3, SYNTH_GEMM_OWN, 264 },
                                     { 4, SYNTH_GEMM_OWN, 264 },  { 3, SYNTH_GEMM_OWN, 192 },  { 4, SYNTH_GEMM_OWN, 192 },
                                     { 1, SYNTH_GEMM_TC, 192 },   { 8, SYNTH_GEMM_TC, 192 },   { 13, SYNTH_GEMM_TC, 192 },
                                     { 24, SYNTH_GEMM_TC, 192 },  { 32, SYNTH_GEMM_TC, 192 },  { 16, SYNTH_GEMM_OWN, 192 },
                                     { 2, SYNTH_GEMM_CUBLAS, 192 } };

/* The attention and Quest selection kernels against a host reference in double precision on random
 * data of awkward sizes: 3 sequences, 2 KV heads, page lists with gaps and a partial last page,
 * several split counts; Quest's choice of pages must be the host's. */
extern "C" int synth_selfcheck(double *attn_err, char *err, size_t errlen)
{
    sy_err E_ = { err, errlen, 0 }, *E = &E_;
    cudaError_t ae = cudaFuncSetAttribute(k_attn, cudaFuncAttributeMaxDynamicSharedMemorySize, TC_SMEM);
    if (ae != cudaSuccess) {   /* its stages take more than the default 48 KiB */
        snprintf(err, errlen, "attention kernel: %s", cudaGetErrorString(ae));
        return -1;
    }
    const int B = 3, nkv = 2, nh = nkv * SY_G, pps = 37, L = 2;
    const size_t n_phys = (size_t)B * pps, page = (size_t)nkv * SY_P * SY_HD;
    int lens[B] = { 1000, 33, 1184 - 5 };
    uint64_t st = 12345;
    int rc = -1;
    __half *hK = (__half *)malloc(n_phys * page * 2), *hV = (__half *)malloc(n_phys * page * 2);
    float *hq = (float *)malloc(sizeof(float) * B * nh * SY_HD);
    int *hptab = (int *)malloc(sizeof(int) * n_phys), *hl = (int *)malloc(sizeof(int) * B * nkv * pps),
        *hn = (int *)malloc(sizeof(int) * B * nkv), hpos[B];
    __half *hmin = (__half *)malloc(L * n_phys * nkv * SY_HD * 2), *hmax = (__half *)malloc(L * n_phys * nkv * SY_HD * 2);
    __half *hatt = (__half *)malloc(sizeof(__half) * B * nh * SY_HD);
    __half *dK = NULL, *dV = NULL, *dmin = NULL, *dmax = NULL, *datt = NULL;
    float *dq = NULL, *po = NULL, *pml = NULL;
    int *dptab = NULL, *dl = NULL, *dn = NULL, *dpos = NULL;
    double worst = 0;
    cublasHandle_t blas = NULL;
    if (!hK || !hV || !hq || !hptab || !hl || !hn || !hmin || !hmax || !hatt) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < n_phys * page; i++) hK[i] = __float2half((float)sy_rand(&st)), hV[i] = __float2half((float)sy_rand(&st));
    for (int i = 0; i < B * nh * SY_HD; i++) hq[i] = (float)sy_rand(&st) * 3;
    for (int b = 0; b < B; b++) {
        hpos[b] = lens[b] - 1;
        for (int j = 0; j < pps; j++) hptab[b * pps + j] = (int)((j * B + b) * 7 % n_phys);   /* a permutation: 7 and 111 are coprime */
        int np = (lens[b] + SY_P - 1) / SY_P;
        for (int h = 0; h < nkv; h++) {
            int n = 0;
            for (int j = 0; j < np; j++)
                if (j == np - 1 || (j * 5 + h + b) % 3 != 0) hl[(b * nkv + h) * pps + n++] = j;   /* gaps; the last page always */
            hn[b * nkv + h] = n;
        }
    }
    if (!(dK = (__half *)sy_dalloc(n_phys * page * 2, E, "self-check")) || !(dV = (__half *)sy_dalloc(n_phys * page * 2, E, "self-check")) ||
        !(dq = (float *)sy_dalloc(sizeof(float) * B * nh * SY_HD, E, "self-check")) ||
        !(dptab = (int *)sy_dalloc(sizeof(int) * n_phys, E, "self-check")) || !(dl = (int *)sy_dalloc(sizeof(int) * B * nkv * pps, E, "self-check")) ||
        !(dn = (int *)sy_dalloc(sizeof(int) * B * nkv, E, "self-check")) || !(dpos = (int *)sy_dalloc(sizeof(int) * B, E, "self-check")) ||
        !(datt = (__half *)sy_dalloc(sizeof(__half) * B * nh * SY_HD, E, "self-check")) ||
        !(po = (float *)sy_dalloc(sizeof(float) * B * nh * 16 * SY_HD, E, "self-check")) ||
        !(pml = (float *)sy_dalloc(sizeof(float) * B * nh * 16 * 2, E, "self-check")) ||
        !(dmin = (__half *)sy_dalloc(L * n_phys * nkv * SY_HD * 2, E, "self-check")) ||
        !(dmax = (__half *)sy_dalloc(L * n_phys * nkv * SY_HD * 2, E, "self-check")))
        goto fail;
    CK(cudaMemcpy(dK, hK, n_phys * page * 2, cudaMemcpyHostToDevice), "self-check");
    CK(cudaMemcpy(dV, hV, n_phys * page * 2, cudaMemcpyHostToDevice), "self-check");
    CK(cudaMemcpy(dq, hq, sizeof(float) * B * nh * SY_HD, cudaMemcpyHostToDevice), "self-check");
    CK(cudaMemcpy(dptab, hptab, sizeof(int) * n_phys, cudaMemcpyHostToDevice), "self-check");
    CK(cudaMemcpy(dl, hl, sizeof(int) * B * nkv * pps, cudaMemcpyHostToDevice), "self-check");
    CK(cudaMemcpy(dn, hn, sizeof(int) * B * nkv, cudaMemcpyHostToDevice), "self-check");
    CK(cudaMemcpy(dpos, hpos, sizeof(int) * B, cudaMemcpyHostToDevice), "self-check");
    for (int n_split = 1; n_split <= 16; n_split += 5) {
        k_attn<<<dim3(n_split, nkv, B), 32, TC_SMEM>>>(dq, dK, dV, dptab, pps, dl, dn, pps, dpos, nkv, n_split, 0.0883883f, po, pml);
        k_attn_combine<<<dim3(nh, B), SY_HD>>>(po, pml, n_split, datt);
        CK(cudaGetLastError(), "self-check attention");
        CK(cudaMemcpy(hatt, datt, sizeof(__half) * B * nh * SY_HD, cudaMemcpyDeviceToHost), "self-check");
        for (int b = 0; b < B; b++)
            for (int h = 0; h < nh; h++) {
                int kv = h / SY_G;
                const float *qq = hq + ((size_t)b * nh + h) * SY_HD;
                double mx = -1e300, sum = 0, o[SY_HD] = { 0 };
                const int *lst = hl + (b * nkv + kv) * pps;
                for (int pass = 0; pass < 2; pass++)
                    for (int i = 0; i < hn[b * nkv + kv]; i++)
                        for (int r = 0; r < SY_P && lst[i] * SY_P + r < lens[b]; r++) {
                            size_t at = (((size_t)hptab[b * pps + lst[i]] * nkv + kv) * SY_P + r) * SY_HD;
                            double dot = 0;
                            for (int d = 0; d < SY_HD; d++) dot += (double)qq[d] * __half2float(hK[at + d]);
                            dot *= 0.0883883;
                            if (pass == 0) mx = dot > mx ? dot : mx;
                            else {
                                double p = exp(dot - mx);
                                sum += p;
                                for (int d = 0; d < SY_HD; d++) o[d] += p * __half2float(hV[at + d]);
                            }
                        }
                double ref_max = 1e-9, dmax_ = 0;
                for (int d = 0; d < SY_HD; d++) {
                    double ref = o[d] / sum, got = __half2float(hatt[((size_t)b * nh + h) * SY_HD + d]);
                    ref_max = fabs(ref) > ref_max ? fabs(ref) : ref_max;
                    dmax_ = fabs(got - ref) > dmax_ || got != got ? (got != got ? 1e9 : fabs(got - ref)) : dmax_;
                }
                if (dmax_ / ref_max > worst) worst = dmax_ / ref_max;
            }
    }
    *attn_err = worst;
    /* Quest: bounds from min/max made from the pages, then the selection */
    for (int l = 0; l < L; l++) {
        for (size_t pg = 0; pg < n_phys; pg++)
            for (int kv = 0; kv < nkv; kv++)
                for (int d = 0; d < SY_HD; d++) {
                    float lo = 1e30f, hi = -1e30f;
                    for (int r = 0; r < SY_P; r++) {
                        float v = __half2float(hK[((pg * nkv + kv) * SY_P + r) * SY_HD + d]) * (l ? -0.5f : 1.0f);
                        lo = v < lo ? v : lo, hi = v > hi ? v : hi;
                    }
                    size_t mm = (((size_t)l * n_phys + pg) * nkv + kv) * SY_HD + d;
                    hmin[mm] = __float2half(lo), hmax[mm] = __float2half(hi);
                }
    }
    CK(cudaMemcpy(dmin, hmin, L * n_phys * nkv * SY_HD * 2, cudaMemcpyHostToDevice), "self-check");
    CK(cudaMemcpy(dmax, hmax, L * n_phys * nkv * SY_HD * 2, cudaMemcpyHostToDevice), "self-check");
    for (int l = 0; l < L; l++) {
        const int k = 9;
        k_quest_bounds<<<dim3((pps + 31) / 32, nkv, B), 128>>>(dq, dmin, dmax, dptab, pps, dpos, nkv, n_phys, l, po, pps);
        k_quest_select<<<dim3(nkv, B), 1024>>>(po, dpos, nkv, k, dl, dn, pps);
        CK(cudaGetLastError(), "self-check Quest");
        CK(cudaMemcpy(hl, dl, sizeof(int) * B * nkv * pps, cudaMemcpyDeviceToHost), "self-check");
        CK(cudaMemcpy(hn, dn, sizeof(int) * B * nkv, cudaMemcpyDeviceToHost), "self-check");
        for (int b = 0; b < B; b++)
            for (int kv = 0; kv < nkv; kv++) {
                int cur = hpos[b] / SY_P, want = cur + 1 < k ? cur + 1 : k;
                const int *got = hl + (b * nkv + kv) * pps;
                if (hn[b * nkv + kv] != want) {
                    snprintf(err, errlen, "self-check: Quest chose %d pages, not %d", hn[b * nkv + kv], want);
                    goto fail;
                }
                if (cur + 1 <= k) continue;
                double u[SY_MAX_PAGES];
                for (int j = 0; j < cur; j++) {
                    u[j] = 0;
                    for (int g = 0; g < SY_G; g++)
                        for (int d = 0; d < SY_HD; d++) {
                            double qv = hq[((size_t)b * nh + kv * SY_G + g) * SY_HD + d];
                            size_t mm = (((size_t)l * n_phys + hptab[b * pps + j]) * nkv + kv) * SY_HD + d;
                            double a = qv * __half2float(hmin[mm]), c = qv * __half2float(hmax[mm]);
                            u[j] += a > c ? a : c;
                        }
                }
                /* every chosen page's bound is at least every unchosen one's (up to rounding) */
                char chosen[SY_MAX_PAGES] = { 0 };
                for (int i = 0; i < k - 1; i++) chosen[got[i]] = 1;
                if (got[k - 1] != cur) {
                    snprintf(err, errlen, "self-check: Quest left out the page being written");
                    goto fail;
                }
                double lo = 1e300, hi = -1e300;
                for (int j = 0; j < cur; j++)
                    if (chosen[j]) lo = u[j] < lo ? u[j] : lo;
                    else hi = u[j] > hi ? u[j] : hi;
                if (hi > lo + 1e-3 * (fabs(lo) + 1)) {
                    snprintf(err, errlen, "self-check: Quest chose a page of bound %g over one of %g (layer %d)", lo, hi, l);
                    goto fail;
                }
            }
    }
    /* the decode products: awkward row counts, K not a multiple of the 256-wide chunk */
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, errlen, "self-check: cuBLAS could not start");
        goto fail;
    }
    for (size_t ci = 0; ci < sizeof gemm_cases / sizeof *gemm_cases; ci++) {
        const int nb = gemm_cases[ci][0], N = 37, Kd = gemm_cases[ci][2];
        static __half hw[37 * 264], hx[32 * 264];
        static float hy[32 * 37];
        float *dy = NULL;
        __half *dw = NULL, *dx = NULL;
        sy_model mm;
        memset(&mm, 0, sizeof mm);
        mm.gemm = gemm_cases[ci][1];
        mm.blas = blas;   /* batches past 4 and SYNTH_GEMM_CUBLAS go through cuBLAS */
        for (int i = 0; i < N * Kd; i++) hw[i] = __float2half((float)sy_rand(&st));
        for (int i = 0; i < nb * Kd; i++) hx[i] = __float2half((float)sy_rand(&st));
        for (int i = 0; i < nb * N; i++) hy[i] = (float)sy_rand(&st);
        int ok = (dw = (__half *)sy_dalloc(sizeof hw, E, "self-check")) && (dx = (__half *)sy_dalloc(sizeof hx, E, "self-check")) &&
                 (dy = (float *)sy_dalloc(sizeof hy, E, "self-check")) &&
                 cudaMemcpy(dw, hw, sizeof hw, cudaMemcpyHostToDevice) == cudaSuccess &&
                 cudaMemcpy(dx, hx, sizeof hx, cudaMemcpyHostToDevice) == cudaSuccess &&
                 cudaMemcpy(dy, hy, sizeof hy, cudaMemcpyHostToDevice) == cudaSuccess &&
                 sy_gemm(&mm, dw, N, Kd, dx, nb, dy, 1) == CUBLAS_STATUS_SUCCESS;
        static float got[32 * 37];
        ok = ok && cudaMemcpy(got, dy, sizeof(float) * nb * N, cudaMemcpyDeviceToHost) == cudaSuccess;
        cudaFree(dw), cudaFree(dx), cudaFree(dy);
        if (!ok) {
            if (!E->failed) snprintf(err, errlen, "self-check: the decode product failed");
            goto fail;
        }
        for (int b = 0; b < nb; b++)
            for (int n = 0; n < N; n++) {
                double ref = hy[b * N + n];
                for (int k = 0; k < Kd; k++) ref += (double)__half2float(hw[n * Kd + k]) * __half2float(hx[b * Kd + k]);
                if (!(fabs(got[b * N + n] - ref) <= 1e-4 * (fabs(ref) + 16))) {
                    snprintf(err, errlen, "self-check: decode product (%s, batch %d) row %d of column %d: %g, not %g", synth_gemm_name(gemm_cases[ci][1]), nb, n, b, got[b * N + n], ref);
                    goto fail;
                }
            }
    }
    {   /* the prefill's flash attention too */
        double pf = 0;
        if (sy_prefill_selfcheck(&pf, E)) goto fail;
        if (pf > worst) *attn_err = pf;
    }
    rc = 0;
fail:
    cudaFree(dK), cudaFree(dV), cudaFree(dq), cudaFree(dptab), cudaFree(dl), cudaFree(dn), cudaFree(dpos), cudaFree(datt);
    cudaFree(po), cudaFree(pml), cudaFree(dmin), cudaFree(dmax);
    if (blas) cublasDestroy(blas);
    free(hK), free(hV), free(hq), free(hptab), free(hl), free(hn), free(hmin), free(hmax), free(hatt);
    return rc;
}

extern "C" int synth_run(const synth_req *req, synth_row_fn row, void *ud, char *err, size_t errlen)
{
    sy_err E_ = { err, errlen, 0 }, *E = &E_;
    const synth_shape *s = req->shape;
    sy_model m;
    int n_dev = 0, rc = -1;
    cudaDeviceProp prop;
    double bw;
    memset(&m, 0, sizeof m);
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        snprintf(err, errlen, "no CUDA device: the synthetic benchmark needs an NVIDIA GPU");
        return -1;
    }
    if (s->head_dim != SY_HD || s->n_head != s->n_head_kv * SY_G) {
        snprintf(err, errlen, "synthetic shape %s: head size %d and %d query heads per KV head are not built in", s->name,
                 s->head_dim, s->n_head / s->n_head_kv);
        return -1;
    }
    /* the kernels' check against host references is tests/gpu's (synth_selfcheck), not the run's */
    CK(cudaGetDeviceProperties(&prop, 0), "device properties");

    if (model_make(&m, s, E)) goto fail;
    m.gemm = req->gemm;
    m.pdl = prop.major >= 9 && !req->no_pdl;
    bw = measure_bandwidth(&m, E);
    if (bw <= 0) goto fail;
    for (int ic = 0; ic < req->n_ctx; ic++)
        for (int ib = 0; ib < req->n_batch; ib++) {
            int B = req->batch[ib], ctx = req->ctx[ic], gen = req->gen;
            int ctx0 = ctx - gen;   /* the timed steps end at the context length */
            int n_split = split_for(B, s->n_head_kv, (ctx + SY_P - 1) / SY_P, prop.multiProcessorCount);
            synth_row r;
            memset(&r, 0, sizeof r);
            r.ctx = ctx, r.batch = B, r.bw_gbs = bw / 1e9;
            snprintf(r.device, sizeof r.device, "%.95s", prop.name);
            r.gemm = req->gemm;
            r.pdl = m.pdl;
            if (ctx0 < (CHESS_SINK + CHESS_WINDOW + 1) * SY_P || ctx > SY_MAX_PAGES * SY_P) {
                for (int ip = 0; ip < req->n_policy; ip++) {
                    r.policy = req->policy[ip], r.step_ms = -1;
                    snprintf(r.note, sizeof r.note, "context %d is outside %d..%d tokens with %d timed steps", ctx,
                             (CHESS_SINK + CHESS_WINDOW + 1) * SY_P + gen, SY_MAX_PAGES * SY_P, gen);
                    row(&r, ud);
                }
                continue;
            }
            size_t fr = 0, tot = 0;
            cudaMemGetInfo(&fr, &tot);
            double need = case_bytes(s, B, ctx, n_split);
            if (need + (512u << 20) > (double)fr) {
                for (int ip = 0; ip < req->n_policy; ip++) {
                    r.policy = req->policy[ip], r.step_ms = -1;
                    snprintf(r.note, sizeof r.note, "does not fit: needs %.1f GiB beside the weights, %.1f GiB free",
                             need / 1073741824.0, fr / 1073741824.0);
                    row(&r, ud);
                }
                continue;
            }
            sy_case c;
            if (case_make(&c, &m, B, ctx0, gen, n_split, E)) {
                case_free(&c, &m);
                goto fail;
            }
            c.n_sm = prop.multiProcessorCount;
            for (int ip = 0; ip < req->n_policy; ip++) {
                r.policy = req->policy[ip];
                if (run_policy(&m, &c, r.policy, bw, req, &r, E)) {
                    case_free(&c, &m);
                    goto fail;
                }
                row(&r, ud);
            }
            case_free(&c, &m);
        }
    /* time to the first token, one sequence, full against TAKE; a short untimed run of each first
     * (cuBLAS picks its kernels for the chunk's shapes on first use) */
    for (int take = 0; req->ttft && take <= 1; take++) {
        sy_ttft t;
        if (sy_prefill(&m, take, 2 * req->chunk, req->chunk, &t, E)) goto fail;
    }
    for (int ic = 0; req->ttft && ic < req->n_ctx; ic++)
        for (int take = 0; take <= 1; take++) {
            synth_row r;
            memset(&r, 0, sizeof r);
            r.kind = 1, r.policy = take ? SYNTH_TAKE : SYNTH_FULL, r.ctx = req->ctx[ic], r.batch = 1, r.bw_gbs = bw / 1e9;
            r.gemm = req->gemm, r.pdl = m.pdl;
            snprintf(r.device, sizeof r.device, "%.95s", prop.name);
            size_t fr = 0, tot = 0;
            cudaMemGetInfo(&fr, &tot);
            double need = (double)r.ctx * s->n_layer * s->n_head_kv * SY_HD * 4 + (double)(req->chunk + 32) * (s->n_ff * 12.0 + s->n_embd * 40.0);
            if (need + (512u << 20) > (double)fr) {
                r.step_ms = -1;
                snprintf(r.note, sizeof r.note, "does not fit: needs %.1f GiB beside the weights, %.1f GiB free", need / 1073741824.0,
                         fr / 1073741824.0);
                row(&r, ud);
                continue;
            }
            sy_ttft t;
            if (sy_prefill(&m, take, r.ctx, req->chunk, &t, E)) goto fail;
            r.ttft_ms = t.ms, r.kv_kept_gib = t.kv_kept_gib, r.peak_gib = t.peak_gib;
            row(&r, ud);
        }
    rc = 0;
fail:
    model_free(&m);
    return rc;
}
