/* synthetic.h - `kvchat bench --device cuda --synthetic SHAPE`: a model of a known shape with random
 * f16 weights made in GPU memory (no file), its decode step resident on the device and captured in a
 * CUDA graph, timed under full attention, CHESS and Quest at several context lengths and batch sizes,
 * each figure set against the memory-bandwidth roofline measured on the same device. The CUDA side is
 * kernels/cuda/synthetic.cu; kernels/cuda_absent.c answers in builds without CUDA. */
#ifndef KVCHAT_SYNTHETIC_H
#define KVCHAT_SYNTHETIC_H

#include <stddef.h>

typedef struct synth_shape {
    const char *name;
    int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab;
    float rope_base;
} synth_shape;

/* The known shapes ("llama-8b": 32 layers, 4096 dims, 32 heads, 8 KV heads, FFN 14336, 128256
 * tokens); NULL for an unknown name. */
const synth_shape *synth_shape_find(const char *name);
/* The known names, comma-separated, for error messages. */
const char *synth_shape_names(void);

enum { SYNTH_FULL, SYNTH_CHESS, SYNTH_QUEST, SYNTH_TAKE };

/* how the decode products run: kvchat's one-pass kernel for batches 1-2, its tensor-core kernel for
 * 3-4, cuBLAS above (the fastest of the three at each batch, measured); the tensor-core kernel for
 * 1..32; cuBLAS for every batch (both to compare) */
enum { SYNTH_GEMM_OWN, SYNTH_GEMM_TC, SYNTH_GEMM_CUBLAS };
const char *synth_gemm_name(int gemm);

typedef struct synth_req {
    const synth_shape *shape;
    const int *ctx;           /* context lengths (tokens already in the cache) */
    int n_ctx;
    const int *batch;         /* sequences decoded together */
    int n_batch;
    const int *policy;        /* SYNTH_* */
    int n_policy;
    int gen;                  /* decode steps timed per case */
    int quest_budget;         /* tokens attended per KV head under Quest (the policy's default 1024) */
    int gemm;                 /* SYNTH_GEMM_* */
    int no_pdl;               /* no programmatic dependent launch between the step's kernels (to compare) */
    int ttft;                 /* also time the first token of one sequence at each context, full vs TAKE */
    int chunk;                /* prefill chunk (tokens): the engine's batch and TAKE's chunk, 512 */
} synth_req;

/* One measured case. Figures the case could not produce (it did not fit) are negative, with why. */
typedef struct synth_row {
    int kind;                 /* 0: decode step; 1: time to first token (ttft_ms, kv_kept_gib) */
    int policy, ctx, batch;
    double step_ms;           /* one decode step of the whole batch, selection included (median) */
    double tok_s;             /* batch / step time */
    double bytes_step;        /* bytes that must move per step (weights once, the KV rows attended,
                                 the summaries the selection reads) */
    double roof_ms;           /* bytes_step / measured bandwidth */
    double kv_frac;           /* KV rows attended / KV rows held */
    double select_ms;         /* CHESS: one rebuild (amortised into step_ms over its period) */
    double peak_gib;          /* GPU memory in use at the case's peak */
    double bw_gbs;            /* the device bandwidth the roofline uses */
    double ttft_ms;           /* prefill of ctx tokens in chunks, to the first sampled token */
    double kv_kept_gib;       /* KV the policy needs at most (TAKE: budget + chunk per layer) */
    char note[160];           /* why a case did not run */
    char device[96];          /* the GPU's name */
    int gemm;                 /* how the products ran (SYNTH_GEMM_*) */
    int pdl;                  /* the step's kernels overlapped their launches (sm_90) */
    /* with KVCHAT_SYNTH_PROFILE set: one step outside the graph, its time by kind of kernel
     * (products, attention, selection, other) and its kernel count */
    double prof_ms[4];
    int prof_kernels;          /* attention kernel vs a double-precision host reference (synth_selfcheck) */
} synth_row;

typedef void (*synth_row_fn)(const synth_row *row, void *ud);

/* Runs every case that fits; calls row() for each case (also for those skipped, with a note).
 * 0, or -1 with err set (no device, out of memory for the weights, a CUDA failure). */
int synth_run(const synth_req *req, synth_row_fn row, void *ud, char *err, size_t errlen);

const char *synth_policy_name(int policy);
/* The decode policy named by the n bytes at name (full, chess or its aggressive preset, quest), or -1. */
int synth_policy_find(const char *name, size_t n);

/* The decode attention and Quest selection kernels against a host reference on random data of
 * awkward sizes; 0 with *attn_err (largest error relative to the output's magnitude), or -1 with err
 * (a CUDA failure, or Quest chose differently). synth_run runs it first. */
int synth_selfcheck(double *attn_err, char *err, size_t errlen);

#endif
