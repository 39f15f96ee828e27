/* backend_cuda.cuh - what the CUDA backend's files (every .cu file in kernels/cuda/) share: the
 * backend's state, the device copy of a weight, and the helpers every op uses (failures, staging,
 * scratch, the activation twins). Internal to kernels/cuda/: nothing outside includes it.
 *
 * Each op's kernels and launches live in the file named after it (the CPU side's name where it has
 * one): vec_dot.cu and vec_gemm.cu (matmul: decode kernels, cuBLAS for many tokens), attn_rows.cu
 * (attention), pick.cu, elementwise.cu (rmsnorm, qk_rope, glu, add_norm, get_rows), scores.cu,
 * key_means.cu, attn_mass.cu, lsh_hits.cu, merge_heads.cu, bound_pages.cu and page_rows.cu; backend_cuda.cu holds
 * the op table, the backend's life, its staging, the weights' upload and the KV page copies. Each
 * file compiles on its own (no relocatable device code): a kernel is launched only from its own
 * file, and what another file needs of it is a host function declared here (to_half, gemm,
 * pick_k_best). */
#ifndef KVCHAT_BACKEND_CUDA_CUH
#define KVCHAT_BACKEND_CUDA_CUH

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "kernels/act_mirror.h"
#include "kernels/backend.h"
#include "kernels/block_pool.h"
#include "kernels/const_copies.h"
#include "kernels/page_copies.h"
#include "kernels/page_tables.h"
#include "kernels/step_graphs.h"
#include "kernels/summary_lists.h"
#include "kernels/upload_batch.h"
#include "common/quant.h"
#include "kernels/weight_f16.h"
}
#include "kernels/quant_blocks.h"
#include "kernels/decode_dot.h"
#include "kernels/attn_group.h"
#include "kernels/attn_flash.h"
#include "kernels/pick_kernels.h"
#include "kernels/bound_kernels.h"
#include "kernels/segment_kernels.h"
#include "kernels/score_kernels.h"
#include "kernels/fused_kernels.h"
#include "kernels/mean_kernels.h"
#include "kernels/mass_kernels.h"

#define COPY_IDLE 4096      /* attention calls a page copy may go unused before it is freed */
#define EW_THREADS 256      /* threads of the element-wise kernels' blocks */

/* A device copy of one weight matrix: n_out rows `stride` bytes apart (padded to 16), holding the
 * file's bytes for the types the kernels decode and f16 values for the others. */
typedef struct dev_weight {
    const void *host;   /* the be_weight's data: the key */
    uint8_t *d;
    uint32_t type;      /* of the device bytes: the file's type, or F16 when converted */
    size_t stride;
    int64_t n_in, n_out;
} dev_weight;

/* What the 8-bit codes in cuda_impl.xq/xd/xs are of: n floats at the twin address x, as they were
 * when the act mirror's count of device changes was `at` (am_table.dev_changes). An op whose
 * output is a decode product's input (rmsnorm, add_norm, glu, attention's combine) writes its
 * codes with it (codes_for, codes_written), and so does a product that quantizes its input
 * itself; a product whose input is still current reads them instead of quantizing it again (one
 * launch fewer). x NULL: the buffers hold nothing known. */
typedef struct act_codes {
    const float *x;
    int64_t n;
    uint64_t at;
} act_codes;

/* A warp's block of 32 activations (a value a lane) rounded to 8-bit codes as decode_dot.h's
 * dd_quantize does: the largest magnitude and the codes' sum met by shuffles (max and integer
 * sums: the order does not matter), code lane of block blk into q, the scale into d, the block sum
 * into bs. Every lane of the warp calls it. */
static __device__ __forceinline__ void quantize_warp_block(float v, int lane, int64_t blk, int8_t *q, float *d,
                                                           float *bs)
{
    float a = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a = dd_amax2(a, __shfl_xor_sync(0xffffffffu, a, o));
    const float s = dd_scale(a);
    const int8_t c = dd_code(v, s);
    q[blk * DD_QBLOCK + lane] = c;
    int sum = c;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) {
        d[blk] = s;
        bs[blk] = dd_block_sum(s, sum);
    }
}

/* What the attention kernels read of a page (kernels/attn_group.h). */
typedef ag_page dev_page;

typedef struct cuda_impl {
    be_backend *cpu;
    cublasHandle_t blas;
    cudaStream_t stream;
    dev_weight **w;           /* the weights' device copies, each allocated once (callers keep pointers) */
    int n_w, cap_w;
    int *w_slots;             /* found by host address: an index into w plus one, 0 empty (open
                               * addressing, a power of two, at most half full) */
    int cap_w_slots;
    uint64_t weight_bytes;
    pc_table copies;          /* device copies of the KV pages */
    pt_set tables;            /* attention's page descriptors on the device, per named list */
    ub_batch batch;           /* an attention call's rows and descriptors, sent as one (send_batch) */
    int32_t *cur_pos;         /* a deferred decode step's positions on the device */
    size_t cap_cur_pos;
    bp_pool blocks;           /* where the copies live: blocks carved from 64 MiB device chunks */
    /* scratch, grown on demand */
    float *y32, *out;          /* outputs of products and attention bound for unbound host arrays */
    __half *cur16;             /* a deferred decode step's own K/V rows in f16, keys then values */
    size_t cap_cur16;
    be_kv_page *rows_list;     /* the page lists with those rows added (be_attn_rows_list) */
    size_t cap_rows_list;
    uint64_t *masks_all;       /* joined calls' token masks, list after list, before staging */
    size_t cap_masks_all;
    __half *x16;               /* the products' input in f16 */
    __half *wtile;             /* a tile of a weight's rows dequantized to f16 for cuBLAS */
    size_t cap_wtile;
    float *xal;                /* a decode product's input copied to 16-byte alignment when it is not */
    size_t cap_xal;
    int8_t *xq;                /* a decode product's input in 8-bit codes (kernels/decode_dot.h) */
    float *xd;                 /* and their scales, one per 32 */
    float *xs;                 /* and their block sums (scale times the sum of the codes) */
    size_t cap_xq, cap_xd, cap_xs;
    act_codes codes;           /* which input xq, xd and xs hold, while it is current */
    uint64_t quantizations;    /* quantize_act launches (be_cuda_input_quantizations) */
    uint64_t runtime_calls;    /* checked calls into the runtime and cuBLAS, ck and ckb (be_cuda_runtime_calls) */
    int64_t widest_in;         /* the largest n_in of the weights on the device */
    int any_integer;           /* one of them is multiplied in integers (its products read codes) */
    int no_mmv;                /* KVCHAT_CUDA_MMV=0: every product through cuBLAS, to compare */
    int mmv_f32;               /* KVCHAT_CUDA_MMV=f32: decode products by the f32 kernel (stage 0's) */
    int mmv_inflight;          /* KVCHAT_CUDA_MMV_INFLIGHT: reads of a row each lane has in flight for a token
                                * (1, 2, 4; 0: by type); for more, 1 or 2 (0 or 4: dd_many_shape) */
    int mmv_wide;              /* Q4_K/Q5_K by the wide path (decode_dot.h; KVCHAT_CUDA_MMV=narrow: not) */
    int mmv_rows;              /* KVCHAT_CUDA_MMV_ROWS: rows a warp of the decode kernel (0: by tokens and
                                * shape, decode_shape) */
    int64_t mmv_max;           /* KVCHAT_CUDA_MMV_MAX: most tokens through the decode kernel (-1: by type) */
    uint64_t rows_written;     /* rows page_rows wrote into page copies (launched), be_cuda_page_rows */
    uint64_t rows_moved;       /* rows page_moves copied between page copies (launched) */
    int page_rows_off;         /* KVCHAT_CUDA_PAGE_ROWS=0: a prompt's K/V rows and an eviction's fresh
                                * pages go up from the host to the page copies, as before page_rows and
                                * page_moves (issue 25, stages 2 and 5), and the selections' summaries
                                * too, as before summary_copy_rows, to compare */
    int launch_apart;          /* KVCHAT_CUDA_LAUNCHES=apart: a launch a product, each product quantizes
                                * its input, attention converts its keys and values apart and sends
                                * positions and masks on their own (stage 4's third part), to compare */
    int inline_off;            /* KVCHAT_CUDA_INLINE=off (or KVCHAT_CUDA_LAUNCHES=apart): every upload
                                * batch copied through the staging arena, and a decode step's token and
                                * positions staged, as before they rode in their launches, to compare */
    uint64_t inline_sends;     /* batches that rode in a launch's parameters (be_cuda_inline_sends) */
    unsigned mmv_smem_set;     /* bit per type slot: the decode kernel's shared memory limit raised */
    float *part_o, *part_ml;   /* attention's per-split partial results */
    uint64_t *pick_keys;       /* the pick's lists of candidates, two rounds' worth */
    float *pick_max;           /* each slice's largest value (the entropy's reference) */
    double *pick_sums;         /* each slice's entropy sums */
    uint8_t *pick_res, *h_pick;   /* the answer: entropy, varentropy, then the k best keys */
    size_t cap_pick_keys, cap_pick_max, cap_pick_sums, cap_pick_res, cap_h_pick;
    sl_table sums;             /* the selection policies' summaries on the device, per named list */
    float *bd_u;               /* the bounds, a row of `stride` a KV head (-inf past a head's count) */
    uint64_t *bd_keys;         /* each head's k best keys (the last merge round's) */
    uint8_t *h_bd;             /* page-locked: the keys, then the bounds, on their way back */
    size_t cap_bd_u, cap_bd_keys, cap_h_bd;
    int64_t *seg_at;           /* SentKV's choice: each head's segments' starts, then their lengths by rank */
    uint64_t *seg_bits;        /* the choice's bitmaps when they come back (the call's bits not bound) */
    size_t cap_seg_at, cap_seg_bits;
    size_t seg_smem_set;       /* the choice kernel's shared memory limit as raised so far */
    unsigned *bd_done;         /* bound_best_kernel's tickets, a KV head's (0 between launches) */
    int bd_done_zeroed;        /* they were set to 0 since the last failure (a launch cut short may leave them) */
    size_t cap_bd_done;
    size_t best_smem_set;      /* bound_best_kernel's shared memory limit as raised so far */
    int bounds_split;          /* KVCHAT_CUDA_BOUNDS=split: Quest's bounds, best and ids in three launches,
                                * as before bound_best_kernel, to compare */
    uint64_t *sel_masks;       /* a choice of tokens' page masks, built on the device (bits_list_kernel) */
    size_t cap_sel_masks;
    ag_page *sel_pages;        /* a selection by bounds as its list, built on the device (sel_gather_kernel) */
    int64_t *sel_hp;           /* and its per-head offsets */
    size_t cap_sel_pages, cap_sel_hp;
    double *km_sq;             /* CHESS's rows: each (row, unit)'s sum of squares (key_means_kernel) */
    size_t cap_km_sq;
    float *ms_e, *ms_factor, *ms_acc;   /* the attention mass: a pass's scores then weights, factors, sums */
    float *h_ms;               /* page-locked: the sums on their way back */
    size_t cap_ms_e, cap_ms_factor, cap_ms_acc, cap_h_ms;
    void *ms_host;             /* the queries packed and the pages' first tokens, before staging */
    int32_t *lsh_hits, *h_lsh; /* the SimHash recall's hits, on the device and page-locked on their way back */
    size_t cap_lsh_hits, cap_h_lsh;
    void *mg_buf, *h_mg;       /* Chelsea's merge: a group's rows and passes' arrays, and its rows on their way back */
    size_t cap_mg_buf, cap_h_mg;
    size_t cap_ms_host;
    size_t cap_y32, cap_out, cap_x16, cap_po, cap_pml;
    int n_sm;                  /* multiprocessors: how finely decode attention splits its pages */
    int attn_scalar;           /* KVCHAT_CUDA_ATTN=scalar: a block per query head (attn_kernel), to compare */
    int attn_splits;           /* KVCHAT_CUDA_ATTN_SPLITS: the grouped and flash kernels' splits (0: by the device) */
    int attn_rows;             /* KVCHAT_CUDA_ATTN_ROWS: rows a slot of the grouped kernels fetches a round
                                * (0: AG_ROWS) */
    int attn_flash;            /* prefill chunks on the tensor cores (attn_flash_kernel); KVCHAT_CUDA_ATTN=grouped:
                                * on the grouped kernel, to compare */
    size_t flash_smem_set;     /* the flash kernel's shared memory limit as raised so far */
    int flash_refused;         /* the device's shared memory is too small for it: said once */
    uint64_t flash_calls;      /* attention calls the flash kernel ran (be_cuda_flash_calls) */
    uint64_t scratch_bytes;
    /* page-locked host buffers: outputs on their way back */
    float *h_y, *h_out;
    size_t cap_h_y, cap_h_out;
    am_table act;              /* device twins of the bound activation buffers */
    /* staging arena for small inputs sent without a wait (positions, page lists, norm weights):
     * page-locked host bytes and their device twin, reused after each wait for the stream */
    char *h_arena, *d_arena;
    size_t arena_cap, arena_off;
    cc_table consts;           /* device copies of small constant inputs (norm weights) */
    uint8_t *h_wstage;         /* page-locked: weight rows on their way to the device */
    size_t cap_wstage;
    uint64_t waits, bytes_up, bytes_down;   /* traffic (be_ops.counters) */
    sg_table graphs;           /* decode work recorded and replayed as graphs (KVCHAT_CUDA_GRAPH=on) */
    cudaError_t graph_error;   /* the last graph call's error, for the message */
    char settings[200];        /* the KVCHAT_CUDA_* settings it was made with that are not the defaults */
    int failed;                /* an op failed: ops do nothing until cuda_failed reports it */
    int dead;                  /* the failure was a device error that no wait clears */
    char fail_msg[320];
    cudaError_t alloc_error;   /* the last allocation's answer (dev_malloc, grow_dev, grow_host): what its callers say */
    int fail_short;            /* the failure recorded is a shortage of memory (fail_alloc), which a policy's
                                * op may take back to let the CPU answer (scratch_short) */
} cuda_impl;
static inline cuda_impl *impl_of(be_backend *b) { return (cuda_impl *)b->impl; }

/* Launch the template instance of a device type: F(TYPE) expands to a launch. */
#define FOR_DEVICE_TYPE(t, F)                      \
    switch (t) {                                   \
    case GGML_TYPE_Q4_0: F(GGML_TYPE_Q4_0); break; \
    case GGML_TYPE_Q5_0: F(GGML_TYPE_Q5_0); break; \
    case GGML_TYPE_Q8_0: F(GGML_TYPE_Q8_0); break; \
    case GGML_TYPE_Q4_K: F(GGML_TYPE_Q4_K); break; \
    case GGML_TYPE_Q5_K: F(GGML_TYPE_Q5_K); break; \
    case GGML_TYPE_Q6_K: F(GGML_TYPE_Q6_K); break; \
    case GGML_TYPE_F16: F(GGML_TYPE_F16); break;   \
    default: F(GGML_TYPE_BF16); break;             \
    }

/* backend_cuda.cu: failures, scratch, staging, constants, activations, weights, page copies */
/* The op table has no error return: the first failure is recorded with its reason, every op after
 * it does nothing, and the forward pass asks (cuda_failed), abandons the chunk and reports it.
 * Every launch, copy and wait is checked by ck (cuBLAS calls by ckb), which also counts it: the
 * profile's runtime calls an op. */
int fail(cuda_impl *ci, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* An allocation of `what` that answered e, recorded: out of memory in the caller's words (fmt: what
 * was needed and what is free; cudaSuccess too: no device call failed, a pool was short), or any
 * other error as the device's own (a fault that ended the context answers every later call with
 * its error: no shortage of memory). -1. */
int fail_alloc(cuda_impl *ci, cudaError_t e, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* bytes as a person reads them: "512 bytes", "36.0 KiB", "1.5 MiB", "2.25 GiB" (buf: 32 bytes). */
const char *bytes_text(char *buf, double bytes);
int ck(cuda_impl *ci, cudaError_t e, const char *what);
int ckb(cuda_impl *ci, cublasStatus_t s, const char *what);
int grow_dev(cuda_impl *ci, void **p, size_t *cap, size_t need);
int grow_host(cuda_impl *ci, void **p, size_t *cap, size_t need);
int sync_stream(cuda_impl *ci, const char *what);
/* Recording (KVCHAT_CUDA_GRAPH=on; kernels/step_graphs.h). Each op first calls seg_op: SEG_START
 * for decode-sized work (at most SEG_ROWS rows or tokens: recorded, a recording begun if none is),
 * SEG_JOIN for work that joins a recording under way but does not begin one (a pick, a host read's
 * copies), SEG_EAGER for anything else (what is recorded runs, then the op issues as before). A
 * recording of SEG_SPLIT calls or more (KVCHAT_CUDA_GRAPH_SPLIT) runs at the next op's start, so the
 * device works on it while the host records the rest. Whatever waits for the stream, frees device
 * or page-locked memory, uploads a weight or calls cuBLAS runs what is recorded first (seg_end):
 * 0, or -1 when it could not run (recorded as a failure that leaves the device lost). */
enum { SEG_EAGER, SEG_JOIN, SEG_START };
#define SEG_ROWS 8
#define SEG_SPLIT 64
void seg_op(cuda_impl *ci, int how);
int seg_end(cuda_impl *ci);
size_t stage_size(size_t bytes);
int stage_reserve(cuda_impl *ci, size_t total);
void *stage(cuda_impl *ci, const void *src, size_t bytes);
int send_to(cuda_impl *ci, void *dst, const void *src, size_t bytes);
const void *const_get(cuda_impl *ci, const void *host, size_t bytes);
const void *const_claim(cuda_impl *ci, const void *host, size_t bytes, int *write);
void host_in(cuda_impl *ci, const void *p, size_t bytes);
int bound(cuda_impl *ci, const void *p, size_t bytes);
dev_weight *find_weight(cuda_impl *ci, const void *host);
int upload_weight(cuda_impl *ci, const be_weight *w, dev_weight **out, char *err, size_t errlen);
void lose_batch(cuda_impl *ci);
int send_batch(cuda_impl *ci);
/* send_batch, and a then b (n values each) rounded to f16 into y[0, 2n) by the same launch */
int send_batch_halves(cuda_impl *ci, const float *a, const float *b, __half *y, int64_t n);
void tables_failed(cuda_impl *ci, int rc);
/* A page list read whole (a policy's, or one placed ahead of attention) on the device under its
 * name and shape (0: none): 0; 1: memory short, nothing recorded; -1: failed (a device error met
 * allocating included). And the failure a scratch allocation recorded taken back (returns 1), the
 * CPU then answering, when it was a shortage of memory; any other is kept (returns -1). */
int policy_list(cuda_impl *ci, uint64_t table, uint64_t shape, const be_kv_page *pages, int64_t np,
                const int64_t *hp, int H, pt_call *pl);
int scratch_short(cuda_impl *ci);
/* An allocation's answer that is the device's own error, not a shortage of memory. */
static inline int device_error(cudaError_t e) { return e != cudaSuccess && e != cudaErrorMemoryAllocation; }

/* vec_dot.cu: where a producer of n floats at the twin dx in `rows` rows (-1: not known) writes
 * their 8-bit codes (scales into *xd, block sums into *xs), or NULL when no decode product would
 * read them (too many rows for the decode kernel, rows not whole blocks of 32, no integer
 * products) or the scratch could not grow (recorded); then, once launched, codes_written. */
int8_t *codes_for(cuda_impl *ci, int64_t n, int64_t rows, float **xd, float **xs);
void codes_written(cuda_impl *ci, const float *dx, int64_t n);

/* vec_gemm.cu: products of many tokens through cuBLAS, and the f16 inputs they read */
int to_half(cuda_impl *ci, const float *x, __half *y, int64_t n);
int gemm(cuda_impl *ci, const dev_weight *dw, const __half *x16, int64_t n_tok, float *dy);

/* pick.cu: the k best of rows of values, as the sampler's keys (kernels/pick_kernels.h) */
int pick_k_best(cuda_impl *ci, const float *x, int64_t n, int64_t row_stride, int n_rows, const int32_t *pen,
                int32_t n_pen, float penalty, int32_t k, const int64_t *blocks, int rounds, uint64_t *scratch,
                float *slice_max, uint64_t *best, const char *what);

/* the ops, each in its own file */
void cuda_matmul(be_backend *b, const be_mm *mms, int n_mm, const float *x, int64_t n_tok);
void cuda_attention(be_backend *b, const be_attn *a);
void cuda_attention_seqs(be_backend *b, const be_attn *a, int n);
void cuda_place_pages(be_backend *b, const be_attn *a, int n);
void cuda_place_bounds(be_backend *b, const be_bounds *r);
void cuda_pick(be_backend *b, be_pick *p, int n);
void cuda_rmsnorm(be_backend *b, const float *x, const float *w, float *y, int64_t rows, int64_t dim, float eps);
void cuda_qk_rope(be_backend *b, const be_qk *r);
void cuda_glu(be_backend *b, float *gate, const float *up, int64_t n, int gelu);
void cuda_add_norm(be_backend *b, float *x, float *o, const float *post, const float *w, float *h, int64_t rows,
                   int64_t dim, float eps);
void cuda_get_rows(be_backend *b, const be_weight *w, const int32_t *ids, int64_t n, float scale, float *out);
void cuda_scores(be_backend *b, const float *m, int64_t n_rows, int64_t dim, const float *x, float *y);
void cuda_key_means(be_backend *b, const be_key_means *m);
void cuda_attn_mass(be_backend *b, const be_mass *m);
void cuda_bound_pages(be_backend *b, be_bounds *r);
const uint16_t *summary_copy_rows(void *ud, const uint16_t *k, uint64_t gen, int32_t rows, int64_t dim);   /* sl_device.copy_rows */
void cuda_page_rows(be_backend *b, const be_page_rows *r, int n);
void cuda_page_moves(be_backend *b, const be_page_move *m, int n);
void cuda_lsh_hits(be_backend *b, const be_lsh *l);
int cuda_merge_heads(be_backend *b, const be_merge *m);

#endif
