/* vec_dot.cu - the CUDA backend's matrix products (be_ops.matmul): the decode kernels, and the
 * choice between them and the many-token path of vec_gemm.cu.
 *
 * Decode (at most QB_MAX_TOK tokens), kernels/decode_dot.h: decode_dot_kernel, a warp per row for
 * one token and for more one or two rows by the launch's shape (dd_many_shape: two load each
 * token's activations once for both, but leave fewer warps), reading the weight straight from
 * global memory. Quantized types: the input is first rounded to 8-bit
 * codes in blocks of 32 (quantize_act, once for all the products that share it), then each lane
 * multiplies 16 values at a time in integers (dp4a); Q4_K and Q5_K by the kernel's wide path
 * instead, 32 values a lane in 16-byte loads (KVCHAT_CUDA_MMV=narrow: the 16-value items, to
 * compare). F16/BF16: 16-byte loads of 8 values times the f32 input. The lanes' sums meet by a
 * butterfly of shuffles. A decode step's products (one token, one row a warp) run instances made for
 * one token, whose other tokens' registers compile away, with more reads in flight a lane (every
 * item's loads issued before any is unpacked: make cuda-build checks it in the sm_90 code).
 * KVCHAT_CUDA_MMV=f32 runs stage 0's kernel instead (mmv_kernel: exact weights times f32
 * activations through shared memory; a block of MMV_WARPS warps computes MMV_ROWS rows a warp, the
 * row read in chunks of QB_CHUNK values, the lanes decoding groups of 32 with qb_lane_dot), to
 * compare the two on a GPU. More tokens than the decode kernels take go to vec_gemm.cu (cuBLAS). */
#include "kernels/cuda/backend_cuda.cuh"

#define MMV_WARPS 8
#define MMV_ROWS 2

/* The lanes' sums of each token added by a butterfly (every lane ends with the same sum; the host
 * tests add in the same order) and written by lane 0 to y[t * n_out]. */
static __device__ void warp_sums_out(float *acc, int n_tok, int lane, float *y, int64_t n_out)
{
#pragma unroll
    for (int t = 0; t < QB_MAX_TOK; t++) {
        if (t >= n_tok) continue;
        float v = acc[t];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (lane == 0) y[(int64_t)t * n_out] = v;
    }
}

/* y[t][row] = dot(row of W, x[t]) for rows of n_in values (a multiple of 32), t < n_tok <= QB_MAX_TOK.
 * Dynamic shared memory: mmv_smem(TYPE, n_tok) bytes. x must be 16-byte aligned. */
template <uint32_t TYPE>
__global__ void __launch_bounds__(MMV_WARPS * 32)
    mmv_kernel(const uint8_t *__restrict__ W, size_t stride, int64_t n_in, int64_t n_out, const float *__restrict__ x,
               int n_tok, float *__restrict__ y)
{
    extern __shared__ __align__(16) unsigned char smem[];
    const int ldx = QB_CHUNK / 32 * QB_XSTRIDE;
    float *xs = (float *)smem;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint8_t *wb = smem + sizeof(float) * (size_t)(ldx * n_tok) + (size_t)warp * qb_chunk_bytes(TYPE);
    const int64_t row0 = ((int64_t)blockIdx.x * MMV_WARPS + warp) * MMV_ROWS;
    const int bv = qb_block_values(TYPE), bb = qb_block_bytes(TYPE);
    float acc[MMV_ROWS][QB_MAX_TOK];
#pragma unroll
    for (int r = 0; r < MMV_ROWS; r++)
#pragma unroll
        for (int t = 0; t < QB_MAX_TOK; t++) acc[r][t] = 0.0f;
    for (int64_t k0 = 0; k0 < n_in; k0 += QB_CHUNK) {
        const int kc = (int)(n_in - k0 < QB_CHUNK ? n_in - k0 : QB_CHUNK);
        const int q4 = kc / 4;
        __syncthreads();   /* every warp is done with the previous chunk's activations */
        for (int i = threadIdx.x; i < n_tok * q4; i += blockDim.x) {
            const int t = i / q4, e = (i - t * q4) * 4;
            const float4 v = *(const float4 *)(x + (int64_t)t * n_in + k0 + e);
            *(float4 *)(xs + t * ldx + (e >> 5) * QB_XSTRIDE + (e & 31)) = v;
        }
        __syncthreads();
        /* the chunk's bytes: a multiple of 16 but for the row's last chunk, whose 16-byte reads run
         * into the row's padding */
        const int n16 = (kc / bv * bb + 15) >> 4;
#pragma unroll
        for (int r = 0; r < MMV_ROWS; r++) {
            const int64_t row = row0 + r;
            if (row < n_out) {   /* the same for the whole warp */
                const uint4 *src = (const uint4 *)(W + (size_t)row * stride + (size_t)(k0 / bv) * bb);
                for (int i = lane; i < n16; i += 32) ((uint4 *)wb)[i] = __ldg(src + i);
                __syncwarp();
                qb_lane_dot(TYPE, wb, kc / 32, xs, ldx, n_tok, lane, acc[r]);
                __syncwarp();   /* the buffer is refilled by the next row */
            }
        }
    }
#pragma unroll
    for (int r = 0; r < MMV_ROWS; r++)
        if (row0 + r < n_out) warp_sums_out(acc[r], n_tok, lane, y + row0 + r, n_out);
}

static size_t mmv_smem(uint32_t type, int n_tok)
{
    return sizeof(float) * (size_t)(QB_CHUNK / 32 * QB_XSTRIDE) * (size_t)n_tok +
           (size_t)MMV_WARPS * (size_t)qb_chunk_bytes(type);
}

#define DD_WARPS 4   /* warps per block of the decode kernels */
/* Blocks a multiprocessor should hold, which bounds the registers a thread: at most 64 for one row a
 * warp (half the multiprocessor's warps), 80 for two (85 before the allocation's rounding to 8).
 * Left to themselves, once the activations were loaded apart from the items, ptxas gave Q6_K's
 * one-row kernel 72-76 registers on sm_80 and the two-row kernels 79-87 on sm_90. */
#define DD_MIN_BLOCKS(rows) ((rows) == 1 ? 8 : 6)
/* Every item's loads come before any is unpacked (decode_dot.h dd_raw), so a kernel holds its items
 * as loaded, and ptxas held to too few registers unpacks an item before the next item's loads are
 * issued (the warp then waits for the first item's bytes before it asks for the next: what made
 * two items in flight no faster than one on the H200). Blocks a multiprocessor, by instance, the
 * most that leave every item's loads ahead of the first unpacking in the sm_90 code (cuobjdump;
 * docs/gpu.md, stage 1's third part): */
static constexpr int dd_min_blocks(uint32_t type, int inflight, int rows, int wide, int one)
{
    return (wide && (type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K))
               ? (rows == 2 ? 5 : inflight == 4 ? 5 : inflight == 2 && (type == GGML_TYPE_Q5_K || !one) ? 6 : 8)
               : inflight == 4 ? (type == GGML_TYPE_F16 || type == GGML_TYPE_BF16 || type == GGML_TYPE_Q4_0 ? 8
                                  : type == GGML_TYPE_Q6_K                                             ? 5
                                                                                                        : 6)
                               : DD_MIN_BLOCKS(rows);
}
/* The most reads in flight a lane of the kernels for several tokens on one row a warp has (made with
 * this many; dd_many_shape chooses it or one): two for the quantized types; one for F16/BF16, which
 * with eight tokens' activations held to 64 registers spill with two. */
#define DD_MANY_INFLIGHT(type) ((type) == GGML_TYPE_F16 || (type) == GGML_TYPE_BF16 ? 1 : 2)

/* n_blocks blocks of 32 activations (over all tokens: rows of n_in % 32 == 0 values are whole
 * blocks) rounded to 8-bit codes q, scales d and block sums bs (decode_dot.h's dd_quantize): a warp
 * per block (quantize_warp_block, as the ops that write a product's input with its codes). */
__global__ void __launch_bounds__(256)
    quantize_act(const float *__restrict__ x, int64_t n_blocks, int8_t *__restrict__ q, float *__restrict__ d,
                 float *__restrict__ bs)
{
    const int64_t blk = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (blk >= n_blocks) return;   /* the whole warp */
    quantize_warp_block(x[blk * DD_QBLOCK + lane], lane, blk, q, d, bs);
}

/* For each product of o (decode_dot.h's dd_outs: its blocks' range of the grid), y[t][row] =
 * dot(row of W, token t), t < n_tok <= QB_MAX_TOK, ROWS rows a warp (rows row0 .. row0 + ROWS - 1;
 * fewer at the end): for a quantized W from the tokens' codes xq [n_tok][n_in] and scales xd
 * [n_tok][n_in / 32] (quantize_act), each lane with INFLIGHT reads of each row in flight
 * (KVCHAT_CUDA_MMV_INFLIGHT); with WIDE, a Q4_K/Q5_K W by decode_dot.h's wide path, which also reads
 * the blocks' sums xs [n_tok][n_in / 32] (its rows 16-byte aligned: blocks of 144 and 176 bytes);
 * for F16/BF16 from the f32 tokens x [n_tok][n_in] (16-byte aligned). Each token's activations are
 * loaded once for the warp's rows. ONE: the kernel of a decode step's products, one token (n_tok
 * must be 1), one row a warp. */
template <uint32_t TYPE, int INFLIGHT, int ROWS, int WIDE, int ONE>
__global__ void __launch_bounds__(DD_WARPS * 32, dd_min_blocks(TYPE, INFLIGHT, ROWS, WIDE, ONE))
    decode_dot_kernel(const dd_outs o, size_t stride, int64_t n_in, const float *__restrict__ x,
                      const int8_t *__restrict__ xq, const float *__restrict__ xd, const float *__restrict__ xs,
                      int n_tok)
{
    if (ONE) n_tok = 1;   /* a constant: tokens 1 .. QB_MAX_TOK - 1's registers and loads compile away */
    const uint8_t *W;
    int32_t n_out, local;
    dd_outs_block(&o, (int32_t)blockIdx.x, &W, &n_out, &local);
    const int lane = threadIdx.x & 31;
    const int32_t row0 = (local * DD_WARPS + (int32_t)(threadIdx.x >> 5)) * ROWS;
    if (row0 >= n_out) return;   /* the whole warp */
    /* a constant 1 for ROWS == 1, so that the second row's registers and loads compile away */
    const int nr = ROWS == 1 ? 1 : (int)(n_out - row0 < ROWS ? n_out - row0 : ROWS);
    float acc[DD_MAX_ROWS][QB_MAX_TOK];
#pragma unroll
    for (int r = 0; r < DD_MAX_ROWS; r++)
#pragma unroll
        for (int t = 0; t < QB_MAX_TOK; t++) acc[r][t] = 0.0f;
    dd_lane_dot(TYPE, WIDE, W + (size_t)row0 * stride, stride, nr, n_in, x, xq, xd, xs, n_tok, lane, 32, INFLIGHT,
                acc);
    float *y = dd_outs_y(&o, (int32_t)blockIdx.x);
#pragma unroll
    for (int r = 0; r < ROWS; r++)
        if (r < nr) warp_sums_out(acc[r], n_tok, lane, y + row0 + r, n_out);
}

/* The decode kernels' shape for a launch of n_tok tokens over n_out rows in all: one row a warp
 * for a token (more warps to hide the memory's latency; its kernel made for one, one_token_inflight),
 * dd_many_shape's for more (two rows a warp hold one item of each in flight: two of each took
 * 107-109 registers on sm_90 on the wide path, a quarter of the warps a multiprocessor holds;
 * its reads in flight are one row's); KVCHAT_CUDA_MMV_ROWS and KVCHAT_CUDA_MMV_INFLIGHT=1|2
 * override them, to compare (4 is a token's kernel's only). */
static dd_many decode_shape(const cuda_impl *ci, uint32_t type, int64_t n_out, int n_tok)
{
    dd_many s = { 1, 1 };
    if (n_tok > 1) s = dd_many_shape(type, ci->mmv_wide, n_out, n_tok, ci->n_sm);
    if (ci->mmv_rows) s.rows = ci->mmv_rows;
    if (ci->mmv_inflight == 1 || ci->mmv_inflight == 2) s.inflight = ci->mmv_inflight;
    return s;
}

/* Reads of its row a lane of a one-token product has in flight, unless KVCHAT_CUDA_MMV_INFLIGHT says:
 * 4, with every item's loads ahead of the first unpacking (dd_min_blocks: at least 20 to 32 warps a
 * multiprocessor by type), but 2 on Q4_K's wide path, whose 4 ptxas unpacks one item of before
 * asking for the others. The H200's times fit one round trip a read in flight (docs/gpu.md, stage
 * 1's third part); gpu_bench times 1, 2 and 4 to choose from. Products of several tokens take
 * decode_shape's. */
static int one_token_inflight(uint32_t type, int wide)
{
    return wide && type == GGML_TYPE_Q4_K ? 2 : 4;
}

/* The type's slot in ci->mmv_smem_set. */
static int type_slot(uint32_t t)
{
    switch (t) {
    case GGML_TYPE_Q4_0: return 0;
    case GGML_TYPE_Q5_0: return 1;
    case GGML_TYPE_Q8_0: return 2;
    case GGML_TYPE_Q4_K: return 3;
    case GGML_TYPE_Q5_K: return 4;
    case GGML_TYPE_Q6_K: return 5;
    case GGML_TYPE_F16: return 6;
    default: return 7;
    }
}
/* Whether a decode product of dw reads 8-bit codes of its input (decode_dot.h) rather than f32. */
static int mmv_int8(const cuda_impl *ci, const dev_weight *dw) { return !ci->mmv_f32 && dd_integer_type(dw->type); }

/* y[i] = W[i] x for n products of one input (one n_in) and one device type, n_tok <= QB_MAX_TOK
 * tokens, n <= DD_MAX_OUTS: dx the 16-byte aligned f32 input (F16/BF16 weights, and every type
 * under KVCHAT_CUDA_MMV=f32), xq/xd/xs its 8-bit codes, scales and block sums (quantized weights).
 * One launch for all n (stage 0's f32 kernel: one each). 0, or -1 (recorded). */
static int mmv(cuda_impl *ci, const dev_weight *const *dw, float *const *dy, int n, const float *dx,
               const int8_t *xq, const float *xd, const float *xs, int n_tok)
{
    const uint32_t type = dw[0]->type;
    if (!ci->mmv_f32) {
        dd_outs o = {};   /* the slots past n unread, but not left undefined */
        o.n = n;
        int64_t n_out = 0;
        for (int i = 0; i < n; i++) {
            o.w[i] = dw[i]->d;
            o.y[i] = dy[i];
            o.n_out[i] = (int32_t)dw[i]->n_out;
            n_out += dw[i]->n_out;
        }
        const dd_many shape = decode_shape(ci, type, n_out, n_tok);
        const int rows = shape.rows;
        const unsigned grid = (unsigned)dd_outs_layout(&o, DD_WARPS * rows);
        const size_t stride = dw[0]->stride;
        const int64_t n_in = dw[0]->n_in;
#define LAUNCH_QI(T, I, R, WD, ONE)                                                                           \
    decode_dot_kernel<T, I, R, WD, ONE><<<grid, DD_WARPS * 32, 0, ci->stream>>>(o, stride, n_in, dx, xq, xd, xs, \
                                                                                 n_tok)
        /* a decode step's one token on one row a warp: reads in flight by type (one_token_inflight) */
#define LAUNCH_ONE(T, WD)                                                             \
    do {                                                                              \
        const int in = ci->mmv_inflight ? ci->mmv_inflight : one_token_inflight(T, WD); \
        if (in == 4) LAUNCH_QI(T, 4, 1, WD, 1);                                       \
        else if (in == 2) LAUNCH_QI(T, 2, 1, WD, 1);                                  \
        else LAUNCH_QI(T, 1, 1, WD, 1);                                               \
    } while (0)
#define LAUNCH_Q(T, WD)                                          \
    do {                                                         \
        if (n_tok == 1 && rows == 1) LAUNCH_ONE(T, WD);          \
        else if (rows == 2) LAUNCH_QI(T, 1, 2, WD, 0);           \
        else if (shape.inflight == 1) LAUNCH_QI(T, 1, 1, WD, 0); \
        else LAUNCH_QI(T, DD_MANY_INFLIGHT(T), 1, WD, 0);        \
    } while (0)
#define LAUNCH_K(T)                          \
    do {                                     \
        if (ci->mmv_wide) LAUNCH_Q(T, 1);    \
        else LAUNCH_Q(T, 0);                 \
    } while (0)
        switch (type) {
        case GGML_TYPE_Q4_0: LAUNCH_Q(GGML_TYPE_Q4_0, 0); break;
        case GGML_TYPE_Q5_0: LAUNCH_Q(GGML_TYPE_Q5_0, 0); break;
        case GGML_TYPE_Q8_0: LAUNCH_Q(GGML_TYPE_Q8_0, 0); break;
        case GGML_TYPE_Q4_K: LAUNCH_K(GGML_TYPE_Q4_K); break;
        case GGML_TYPE_Q5_K: LAUNCH_K(GGML_TYPE_Q5_K); break;
        case GGML_TYPE_Q6_K: LAUNCH_Q(GGML_TYPE_Q6_K, 0); break;
        case GGML_TYPE_F16: LAUNCH_Q(GGML_TYPE_F16, 0); break;
        default: LAUNCH_Q(GGML_TYPE_BF16, 0); break;
        }
#undef LAUNCH_QI
#undef LAUNCH_ONE
#undef LAUNCH_Q
#undef LAUNCH_K
        return ck(ci, cudaGetLastError(), "decode product");
    }
    const size_t smem = mmv_smem(type, n_tok);
    const unsigned bit = 1u << type_slot(type);
    if (!(ci->mmv_smem_set & bit)) {
        /* the most any token count needs, once per type (beyond the default 48 KiB) */
        const int most = (int)mmv_smem(type, QB_MAX_TOK);
        cudaError_t e = cudaSuccess;
#define SET_SMEM(T) e = cudaFuncSetAttribute(mmv_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, most)
        FOR_DEVICE_TYPE(type, SET_SMEM)
#undef SET_SMEM
        if (ck(ci, e, "decode product setup")) return -1;
        ci->mmv_smem_set |= bit;
    }
    for (int i = 0; i < n; i++) {
        const unsigned grid = (unsigned)((dw[i]->n_out + MMV_WARPS * MMV_ROWS - 1) / (MMV_WARPS * MMV_ROWS));
#define LAUNCH_MMV(T)                                                                                                \
    mmv_kernel<T><<<grid, MMV_WARPS * 32, smem, ci->stream>>>(dw[i]->d, dw[i]->stride, dw[i]->n_in, dw[i]->n_out, dx, \
                                                              n_tok, dy[i])
        FOR_DEVICE_TYPE(type, LAUNCH_MMV)
#undef LAUNCH_MMV
        if (ck(ci, cudaGetLastError(), "decode product")) return -1;
    }
    return 0;
}

/* The most tokens a product runs through the decode kernel, in passes of QB_MAX_TOK that each read
 * the stored weight once, rather than through cuBLAS, which first writes the weight as f16 in tiles
 * and reads it back. By bytes the passes would win up to 32-64 tokens on the quantized types, but
 * measured on an H200 (docs/gpu.md, stage 0) the decode kernel's time grows with its tokens (8
 * tokens cost 3-4x one) and the tile path is 1.3-8x faster from 9 to 64 tokens at 7B shapes (equal
 * only on 4096 x 14336 at 9 tokens): so QB_MAX_TOK, until the decode kernel runs at memory speed
 * for every token count. KVCHAT_CUDA_MMV_MAX=N sets it, to measure either side. */
static int64_t mmv_most_tokens(const cuda_impl *ci) { return ci->mmv_max >= 0 ? ci->mmv_max : QB_MAX_TOK; }

static int mmv_takes(const cuda_impl *ci, const dev_weight *dw, int64_t n_tok)
{
    if (ci->no_mmv || dw->n_in % 32 || dw->n_out > INT32_MAX / 2) return 0;   /* dd_outs counts rows in 32 bits */
    return n_tok <= QB_MAX_TOK || n_tok <= mmv_most_tokens(ci);
}
int8_t *codes_for(cuda_impl *ci, int64_t n, int64_t rows, float **xd, float **xs)
{
    if (ci->launch_apart || ci->no_mmv || ci->mmv_f32 || !ci->any_integer || n <= 0 || n % DD_QBLOCK) return NULL;
    /* a product of more tokens goes to cuBLAS (mmv_takes); rows unknown (glu): at most the decode
     * kernel's tokens at the widest weight's n_in */
    const int64_t most = mmv_most_tokens(ci) > QB_MAX_TOK ? mmv_most_tokens(ci) : QB_MAX_TOK;
    if (rows >= 0 ? rows > most : n > most * ci->widest_in) return NULL;
    ci->codes.x = NULL;
    const size_t n_blocks = (size_t)(n / DD_QBLOCK);
    if (grow_dev(ci, (void **)&ci->xq, &ci->cap_xq, (size_t)n) ||
        grow_dev(ci, (void **)&ci->xd, &ci->cap_xd, sizeof(float) * n_blocks) ||
        grow_dev(ci, (void **)&ci->xs, &ci->cap_xs, sizeof(float) * n_blocks))
        return NULL;
    *xd = ci->xd;
    *xs = ci->xs;
    return ci->xq;
}

void codes_written(cuda_impl *ci, const float *dx, int64_t n) { ci->codes = act_codes{ dx, n, ci->act.dev_changes }; }

void cuda_matmul(be_backend *b, const be_mm *mms, int n_mm, const float *x, int64_t n_tok)
{
    cuda_impl *ci = impl_of(b);
    seg_op(ci, n_tok <= SEG_ROWS ? SEG_START : SEG_EAGER);
    if (ci->failed || n_tok <= 0) return;
    int64_t n_in = mms[0].w->n_in, n_x = n_tok * n_in, n_y = 0;
    dev_weight *dw[8];
    char err[600];
    if (n_mm > 8) {
        fail(ci, "internal error: %d products sharing one input (at most 8)", n_mm);
        return;
    }
    for (int m = 0; m < n_mm; m++) {
        if (upload_weight(ci, mms[m].w, &dw[m], err, sizeof err)) {
            fail(ci, "%s", err);
            return;
        }
        if (!bound(ci, mms[m].y, sizeof(float) * (size_t)(n_tok * mms[m].w->n_out))) n_y += n_tok * mms[m].w->n_out;
    }
    /* each product by the decode kernel (in groups of QB_MAX_TOK tokens) or by cuBLAS on f16 */
    int by_mmv[8], any_f32 = 0, any_int8 = 0, any_gemm = 0;
    for (int m = 0; m < n_mm; m++) {
        by_mmv[m] = mmv_takes(ci, dw[m], n_tok);
        any_int8 |= by_mmv[m] && mmv_int8(ci, dw[m]);
        any_f32 |= by_mmv[m] && !mmv_int8(ci, dw[m]);
        any_gemm |= !by_mmv[m];
    }
    if (any_gemm && grow_dev(ci, (void **)&ci->x16, &ci->cap_x16, sizeof(__half) * (size_t)n_x)) return;
    if (n_y && grow_dev(ci, (void **)&ci->y32, &ci->cap_y32, sizeof(float) * (size_t)n_y)) return;
    if (n_y && grow_host(ci, (void **)&ci->h_y, &ci->cap_h_y, sizeof(float) * (size_t)n_y)) return;
    const float *dx = (const float *)am_dev_in(&ci->act, x, sizeof(float) * (size_t)n_x);
    const float *twin = dx;   /* the input's twin, which its codes are kept for; NULL: staged */
    if (!dx && !(dx = (const float *)stage(ci, x, sizeof(float) * (size_t)n_x))) return;
    if (any_f32 && ((uintptr_t)dx & 15)) {
        /* the kernel reads the activations 16 bytes at a time */
        if (grow_dev(ci, (void **)&ci->xal, &ci->cap_xal, sizeof(float) * (size_t)n_x) ||
            ck(ci, cudaMemcpyAsync(ci->xal, dx, sizeof(float) * (size_t)n_x, cudaMemcpyDeviceToDevice, ci->stream),
               "aligning the input"))
            return;
        dx = ci->xal;
    }
    if (any_gemm && to_half(ci, dx, ci->x16, n_x)) return;
    /* the input's codes are current: made from these bytes (by the op that wrote them, or by an
     * earlier product) and nothing changed a twin since */
    const act_codes *c = &ci->codes;
    int current = twin && c->x == twin && c->n == n_x && c->at == ci->act.dev_changes;
    if (any_int8 && (ci->launch_apart || !current)) {
        /* the input's 8-bit codes, once for every product that reads them (unless the op that wrote
         * the input wrote them too, or an earlier product made them from the same bytes) */
        const int64_t n_blocks = n_x / DD_QBLOCK;
        ci->codes.x = NULL;
        if (grow_dev(ci, (void **)&ci->xq, &ci->cap_xq, (size_t)n_x) ||
            grow_dev(ci, (void **)&ci->xd, &ci->cap_xd, sizeof(float) * (size_t)n_blocks) ||
            grow_dev(ci, (void **)&ci->xs, &ci->cap_xs, sizeof(float) * (size_t)n_blocks))
            return;
        quantize_act<<<(unsigned)((n_blocks + 7) / 8), 256, 0, ci->stream>>>(dx, n_blocks, ci->xq, ci->xd, ci->xs);
        if (ck(ci, cudaGetLastError(), "quantize_act")) return;
        ci->quantizations++;
        current = twin != NULL;
        if (twin) ci->codes = act_codes{ twin, n_x, 0 };
    }
    /* each output's twin when it is bound, else scratch copied back below */
    float *dy[8];
    int64_t off = 0;
    for (int m = 0; m < n_mm; m++) {
        int64_t n_out = mms[m].w->n_out;
        dy[m] = (float *)am_dev_out(&ci->act, mms[m].y, sizeof(float) * (size_t)(n_tok * n_out));
        if (!dy[m]) {
            dy[m] = ci->y32 + off;
            off += n_tok * n_out;
        }
        if (!by_mmv[m] && gemm(ci, dw[m], ci->x16, n_tok, dy[m])) return;
    }
    /* the decode products in launches of one type and row length, up to DD_MAX_OUTS a launch
     * (KVCHAT_CUDA_LAUNCHES=apart: one each) */
    int done[8] = { 0 };
    for (int m = 0; m < n_mm; m++) {
        if (!by_mmv[m] || done[m]) continue;
        int grp[DD_MAX_OUTS], ng = 0;
        for (int k = m; k < n_mm && ng < (ci->launch_apart ? 1 : DD_MAX_OUTS); k++) {
            if (by_mmv[k] && !done[k] && dw[k]->type == dw[m]->type && dw[k]->stride == dw[m]->stride) {
                grp[ng++] = k;
                done[k] = 1;
            }
        }
        for (int64_t t0 = 0; t0 < n_tok; t0 += QB_MAX_TOK) {   /* rows of n_in % 32 == 0 floats: aligned */
            const int nt = (int)(n_tok - t0 < QB_MAX_TOK ? n_tok - t0 : QB_MAX_TOK);
            const int8_t *xq = any_int8 ? ci->xq + t0 * n_in : NULL;
            const float *xd = any_int8 ? ci->xd + t0 * (n_in / DD_QBLOCK) : NULL;
            const float *xs = any_int8 ? ci->xs + t0 * (n_in / DD_QBLOCK) : NULL;
            const dev_weight *gw[DD_MAX_OUTS];
            float *gy[DD_MAX_OUTS];
            for (int i = 0; i < ng; i++) {
                gw[i] = dw[grp[i]];
                gy[i] = dy[grp[i]] + t0 * dw[grp[i]]->n_out;
            }
            if (mmv(ci, gw, gy, ng, dx + t0 * n_in, xq, xd, xs, nt)) return;
        }
    }
    /* the outputs are not the input: codes current before the outputs were written stay current
     * (codes that were not, for this input or another, are left stale) */
    if (current) ci->codes.at = ci->act.dev_changes;
    if (!n_y) return;
    ci->bytes_down += sizeof(float) * (size_t)n_y;
    if (ck(ci, cudaMemcpyAsync(ci->h_y, ci->y32, sizeof(float) * (size_t)n_y, cudaMemcpyDeviceToHost, ci->stream),
           "download") ||
        sync_stream(ci, "matmul"))
        return;
    off = 0;
    for (int m = 0; m < n_mm; m++) {
        size_t ny = (size_t)(n_tok * mms[m].w->n_out);
        if (bound(ci, mms[m].y, sizeof(float) * ny)) continue;
        memcpy(mms[m].y, ci->h_y + off, sizeof(float) * ny);
        off += (int64_t)ny;
    }
}
