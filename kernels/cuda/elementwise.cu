/* elementwise.cu - the CUDA backend's row-wise ops: rmsnorm, qk_rope and add_norm (the fused ops of
 * kernels/fused_kernels.h, the CPU's floats), glu, and get_rows (embedding rows decoded on the
 * device). */
#include "kernels/cuda/backend_cuda.cuh"

/* A warp's sum of its lanes' values by xor shuffles (fk_warp_sum_host's order). */
static __device__ double warp_sum(double v)
{
    for (int r = 0; r < FK_XOR_ROUNDS; r++) v += __shfl_xor_sync(0xffffffffu, v, fk_xor_offset(r));
    return v;
}

/* A block's sum: each warp's, then the warps' in order (fk_block_sum_host); red holds a double a
 * warp, free again when this returns. */
static __device__ double block_sum(double v, double *red)
{
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    double tot = 0;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) tot += red[i];
    __syncthreads();
    return tot;
}

/* A product's input written by the op before it: with q (rows of dim % 32 == 0 values), the 8-bit
 * codes of the row's blocks of 32 too (quantize_warp_block), so the product need not quantize it.
 * Thread t of a block a row owns elements t, t + step, ... (step a multiple of 32): warp w's lanes
 * hold one block at each turn, and reread what they wrote. */
static __device__ void row_codes(const float *yr, int64_t row, int64_t dim, int step, int8_t *q, float *qd, float *qs)
{
    for (int64_t i = threadIdx.x; i < dim; i += step)
        quantize_warp_block(yr[i], (int)(threadIdx.x & 31), (row * dim + i) / DD_QBLOCK, q, qd, qs);
}

/* One block a row; the sum of squares in double, as the CPU backend accumulates it; the codes
 * with q. */
__global__ void rmsnorm_kernel(const float *x, const float *w, float *y, int64_t dim, float eps, int8_t *q, float *qd,
                               float *qs)
{
    __shared__ double red[EW_THREADS / 32];
    const float *xr = x + (int64_t)blockIdx.x * dim;
    float *yr = y + (int64_t)blockIdx.x * dim;
    float scale = fk_norm_factor(block_sum(fk_sumsq(xr, dim, threadIdx.x, EW_THREADS), red), dim, eps);
    for (int64_t i = threadIdx.x; i < dim; i += EW_THREADS) yr[i] = xr[i] * scale * w[i];
    if (q) row_codes(yr, blockIdx.x, dim, EW_THREADS, q, qd, qs);
}

/* A decode step's few values (its tokens' ids, their positions) carried in a launch's parameters
 * instead of copied up (docs/gpu.md, stage 4's fifth part); `write`: where the kernel also puts the
 * values on the device (the constant table's copy of the positions, which attention reads), or NULL. */
#define STEP_INLINE 8   /* a batch's sequences at most (BE_ATTN_SEQS_MAX) */
static_assert(STEP_INLINE >= BE_ATTN_SEQS_MAX, "a batched decode step's ids and positions ride in one launch");
typedef struct step_vals {
    int32_t v[STEP_INLINE];
    int32_t *write;
} step_vals;

/* 1 when a step of n tokens carries its ids and positions in its launches. */
static int carried(const cuda_impl *ci, int64_t n) { return !ci->inline_off && n <= STEP_INLINE; }

/* qk_rope (kernels/fused_kernels.h): a block a token, a warp a head row. The angles are built by
 * one thread as the CPU backend builds them, so the floats are the same. The positions at pos, or
 * (pos NULL) in P. */
__global__ void __launch_bounds__(FK_QK_THREADS) qk_rope_kernel(float *q, float *k, const int32_t *pos,
                                                                const __grid_constant__ step_vals P,
                                                                int n_head, int n_head_kv, int head_dim,
                                                                const float *q_norm, const float *k_norm, float eps,
                                                                float theta_scale, float freq_scale, int neox,
                                                                float q_scale)
{
    extern __shared__ float cs[];
    int half = head_dim / 2;
    float *sn = cs + half;
    int64_t t = blockIdx.x;
    const int32_t pt = pos ? pos[t] : P.v[t];
    if (P.write && threadIdx.x == 0) P.write[t] = pt;
    if (threadIdx.x == 0) fk_angles((float)pt * freq_scale, theta_scale, half, cs);
    __syncthreads();
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float th = cs[i];
        sn[i] = sinf(th);
        cs[i] = cosf(th);
    }
    __syncthreads();
    for (int j = fk_qk_first_row(threadIdx.x); j < n_head + n_head_kv; j += FK_QK_WARPS) {
        const float *w;
        float s;
        float *v = fk_qk_row(q, k, t, j, n_head, n_head_kv, head_dim, q_norm, k_norm, q_scale, &w, &s);
        float f = w ? fk_norm_factor(warp_sum(fk_qk_lane_sumsq(v, head_dim, threadIdx.x)), head_dim, eps) : 1.0f;
        fk_qk_lane_pairs(v, head_dim, threadIdx.x, neox, w, f, cs, sn, s);
    }
}

/* add_norm (kernels/fused_kernels.h): a block a row; h's codes with q. */
__global__ void __launch_bounds__(FK_AN_THREADS) add_norm_kernel(float *x, float *o, const float *post, const float *w,
                                                                 float *h, int64_t dim, float eps, int8_t *q,
                                                                 float *qd, float *qs)
{
    __shared__ double red[FK_AN_THREADS / 32];
    x += (int64_t)blockIdx.x * dim;
    o += (int64_t)blockIdx.x * dim;
    float f = post ? fk_norm_factor(block_sum(fk_an_thread_sumsq(o, dim, threadIdx.x), red), dim, eps) : 1.0f;
    double ss = fk_an_thread_add(x, o, post, f, w != NULL, dim, threadIdx.x);
    if (!w) return;
    float g = fk_norm_factor(block_sum(ss, red), dim, eps);
    fk_an_thread_norm(x, w, g, h + (int64_t)blockIdx.x * dim, dim, threadIdx.x);
    if (q) row_codes(h + (int64_t)blockIdx.x * dim, blockIdx.x, dim, FK_AN_THREADS, q, qd, qs);
}

/* gate = act(gate) * up; with q (n % 32 == 0: a warp is one block of 32, wholly in or out), the
 * codes of the result too. */
__global__ void glu_kernel(float *gate, const float *up, int64_t n, int gelu, int8_t *q, float *qd, float *qs)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = gate[i], r;
    if (gelu) r = 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * up[i];
    else r = g / (1.0f + expf(-g)) * up[i];
    gate[i] = r;
    if (q) quantize_warp_block(r, (int)(threadIdx.x & 31), i / DD_QBLOCK, q, qd, qs);
}

static unsigned ew_blocks(int64_t n) { return (unsigned)((n + EW_THREADS - 1) / EW_THREADS); }

/* Each op below runs on the device when every activation it touches is bound, and otherwise on the
 * CPU backend after bringing the bound ones' host copies up to date. */

void cuda_rmsnorm(be_backend *b, const float *x, const float *w, float *y, int64_t rows, int64_t dim, float eps)
{
    cuda_impl *ci = impl_of(b);
    seg_op(ci, rows <= SEG_ROWS ? SEG_START : SEG_EAGER);
    size_t bytes = sizeof(float) * (size_t)(rows * dim);
    if (ci->failed || rows <= 0) return;
    if (bound(ci, x, bytes) && bound(ci, y, bytes)) {
        const float *dw = (const float *)const_get(ci, w, sizeof(float) * (size_t)dim);
        if (!dw) return;
        const float *dx = x == y ? NULL : (const float *)am_dev_in(&ci->act, x, bytes);
        float *dy = (float *)am_dev_out(&ci->act, y, bytes);
        float *qd = NULL, *qs = NULL;
        int8_t *q = dim % DD_QBLOCK ? NULL : codes_for(ci, rows * dim, rows, &qd, &qs);
        if (ci->failed) return;
        rmsnorm_kernel<<<(unsigned)rows, EW_THREADS, 0, ci->stream>>>(dx ? dx : dy, dw, dy, dim, eps, q, qd, qs);
        if (!ck(ci, cudaGetLastError(), "rmsnorm") && q) codes_written(ci, dy, rows * dim);
        return;
    }
    host_in(ci, x, bytes);
    am_host_write(&ci->act, y, bytes);
    ci->cpu->ops->rmsnorm(ci->cpu, x, w, y, rows, dim, eps);
}

void cuda_qk_rope(be_backend *b, const be_qk *r)
{
    cuda_impl *ci = impl_of(b);
    seg_op(ci, r->n_tok <= SEG_ROWS ? SEG_START : SEG_EAGER);
    size_t bq = sizeof(float) * (size_t)(r->n_tok * r->n_head * r->head_dim),
           bk = sizeof(float) * (size_t)(r->n_tok * r->n_head_kv * r->head_dim);
    if (ci->failed || r->n_tok <= 0) return;
    if (bound(ci, r->q, bq) && bound(ci, r->k, bk) && r->head_dim % 2 == 0) {
        size_t wb = sizeof(float) * (size_t)r->head_dim;
        /* the norms first: sending a constant may make room in the staging arena, which frees what
         * was staged before it */
        const float *dqn = r->q_norm ? (const float *)const_get(ci, r->q_norm, wb) : NULL;
        const float *dkn = r->k_norm ? (const float *)const_get(ci, r->k_norm, wb) : NULL;
        if ((r->q_norm && !dqn) || (r->k_norm && !dkn)) return;
        /* the positions: every layer of a step has the same (and attention reads them too), kept
         * in the constant table; a decode step's carried in the launch, which writes them there
         * when they changed (the first layer's) */
        const size_t pb = sizeof(int32_t) * (size_t)r->n_tok;
        step_vals P = {};
        const int carry = carried(ci, r->n_tok);
        int write = 0;
        const int32_t *dp = (const int32_t *)(ci->launch_apart ? stage(ci, r->pos, pb)
                                              : carry          ? const_claim(ci, r->pos, pb, &write)
                                                               : const_get(ci, r->pos, pb));
        if (!dp) return;   /* (nothing claimed: a claim that must be written is launched below) */
        if (carry) {
            memcpy(P.v, r->pos, pb);
            if (write) P.write = (int32_t *)dp;
        }
        float *dq = (float *)am_dev_out(&ci->act, r->q, bq), *dk = (float *)am_dev_out(&ci->act, r->k, bk);
        /* the same powf as the CPU backend, on the host */
        float theta_scale = powf(r->freq_base, -2.0f / (float)r->head_dim);
        qk_rope_kernel<<<(unsigned)r->n_tok, FK_QK_THREADS, sizeof(float) * (size_t)r->head_dim, ci->stream>>>(
            dq, dk, carry ? NULL : dp, P, r->n_head, r->n_head_kv, r->head_dim, dqn, dkn, r->eps, theta_scale,
            r->freq_scale, r->neox, r->q_scale);
        if (ck(ci, cudaGetLastError(), "qk_rope") && write) cc_unwritten(&ci->consts, r->pos);
        return;
    }
    am_range rd[2] = { { r->q, bq }, { r->k, bk } };
    am_host_read(&ci->act, rd, 2);
    am_host_write(&ci->act, r->q, bq);
    am_host_write(&ci->act, r->k, bk);
    ci->cpu->ops->qk_rope(ci->cpu, r);
}

void cuda_glu(be_backend *b, float *gate, const float *up, int64_t n, int gelu)
{
    cuda_impl *ci = impl_of(b);
    seg_op(ci, SEG_JOIN);   /* its rows are not known: it joins its products' recording */
    size_t bytes = sizeof(float) * (size_t)n;
    if (ci->failed || n <= 0) return;
    if (bound(ci, gate, bytes) && bound(ci, up, bytes)) {
        const float *du = (const float *)am_dev_in(&ci->act, up, bytes);
        float *dg = (float *)am_dev_out(&ci->act, gate, bytes);
        float *qd = NULL, *qs = NULL;
        int8_t *q = codes_for(ci, n, -1, &qd, &qs);
        if (ci->failed) return;
        glu_kernel<<<ew_blocks(n), EW_THREADS, 0, ci->stream>>>(dg, du, n, gelu, q, qd, qs);
        if (!ck(ci, cudaGetLastError(), "glu") && q) codes_written(ci, dg, n);
        return;
    }
    am_range r[2] = { { gate, bytes }, { up, bytes } };
    am_host_read(&ci->act, r, 2);
    am_host_write(&ci->act, gate, bytes);
    ci->cpu->ops->glu(ci->cpu, gate, up, n, gelu);
}
void cuda_add_norm(be_backend *b, float *x, float *o, const float *post, const float *w, float *h, int64_t rows,
                          int64_t dim, float eps)
{
    cuda_impl *ci = impl_of(b);
    seg_op(ci, rows <= SEG_ROWS ? SEG_START : SEG_EAGER);
    size_t bytes = sizeof(float) * (size_t)(rows * dim), wb = sizeof(float) * (size_t)dim;
    if (ci->failed || rows <= 0) return;
    if (bound(ci, x, bytes) && bound(ci, o, bytes) && (!w || bound(ci, h, bytes))) {
        const float *dpost = post ? (const float *)const_get(ci, post, wb) : NULL;
        const float *dw = w ? (const float *)const_get(ci, w, wb) : NULL;
        if ((post && !dpost) || (w && !dw)) return;
        float *dx = (float *)am_dev_out(&ci->act, x, bytes);
        float *dox = post ? (float *)am_dev_out(&ci->act, o, bytes) : (float *)am_dev_in(&ci->act, o, bytes);
        float *dh = w ? (float *)am_dev_out(&ci->act, h, bytes) : NULL;
        float *qd = NULL, *qs = NULL;
        int8_t *q = !w || dim % DD_QBLOCK ? NULL : codes_for(ci, rows * dim, rows, &qd, &qs);
        if (ci->failed) return;
        add_norm_kernel<<<(unsigned)rows, FK_AN_THREADS, 0, ci->stream>>>(dx, dox, dpost, dw, dh, dim, eps, q, qd, qs);
        if (!ck(ci, cudaGetLastError(), "add_norm") && q) codes_written(ci, dh, rows * dim);
        return;
    }
    am_range r[2] = { { x, bytes }, { o, bytes } };
    am_host_read(&ci->act, r, 2);
    am_host_write(&ci->act, x, bytes);
    if (post) am_host_write(&ci->act, o, bytes);
    if (w) am_host_write(&ci->act, h, bytes);
    ci->cpu->ops->add_norm(ci->cpu, x, o, post, w, h, rows, dim, eps);
}

/* Embedding rows of a weight the device holds as the file stores it: thread (token, group of 32)
 * decodes its values exactly as the reference dequantizer (kernels/quant_blocks.h), then scales them
 * as the CPU backend does. */
__global__ void get_rows_kernel(const uint8_t *w, uint32_t type, size_t stride, const int32_t *ids,
                                const __grid_constant__ step_vals I,
                                int64_t n, int64_t n_in, float scale, float *out)
{
    const int64_t groups = n_in / 32, i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * groups) return;
    const int64_t t = i / groups, g = i % groups;
    float y[32];
    qb_row_group(type, w + (size_t)(ids ? ids[t] : I.v[t]) * stride, g, y);
    float *o = out + t * n_in + g * 32;
    for (int j = 0; j < 32; j++) o[j] = scale != 1.0f ? __fmul_rn(y[j], scale) : y[j];
}

/* Embedding rows: gathered on the device when the weight is there as stored (a tied output
 * weight) and the rows are bound, so a decode step's input never goes through the host; else
 * dequantized exactly on the host (a row a token) and uploaded at their first use. */
void cuda_get_rows(be_backend *b, const be_weight *w, const int32_t *ids, int64_t n, float scale, float *out)
{
    cuda_impl *ci = impl_of(b);
    seg_op(ci, n <= SEG_ROWS ? SEG_START : SEG_EAGER);
    size_t bytes = sizeof(float) * (size_t)(n * w->n_in);
    dev_weight *dw = ci->failed || n <= 0 ? NULL : find_weight(ci, w->data);
    if (dw && dw->type == w->type && qb_native(w->type) && w->n_in % 32 == 0 && bound(ci, out, bytes)) {
        /* a decode step's ids carried in the launch, a prompt's staged */
        step_vals I = {};
        const int carry = carried(ci, n);
        const int32_t *d_ids = NULL;
        if (carry) memcpy(I.v, ids, sizeof(int32_t) * (size_t)n);
        else if (!(d_ids = (const int32_t *)stage(ci, ids, sizeof(int32_t) * (size_t)n))) return;
        float *d_out = (float *)am_dev_out(&ci->act, out, bytes);
        int64_t threads = n * (w->n_in / 32);
        get_rows_kernel<<<(unsigned)((threads + EW_THREADS - 1) / EW_THREADS), EW_THREADS, 0, ci->stream>>>(
            dw->d, dw->type, dw->stride, d_ids, I, n, w->n_in, scale, d_out);
        ck(ci, cudaGetLastError(), "embedding kernel");
        return;
    }
    am_host_write(&ci->act, out, bytes);
    ci->cpu->ops->get_rows(ci->cpu, w, ids, n, scale, out);
}
