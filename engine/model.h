/* model.h - a loaded model: hyperparameters read from GGUF metadata, weight views into the mapped
 * file, and the tokenizer.
 *
 * Supports the Gemma 3 and Llama (Llama 2, TinyLlama, Mistral) architectures. Loading validates every
 * tensor the forward pass will touch (present, right shape, a weight type kvchat can compute with)
 * so that the forward pass itself never fails on the file. */
#ifndef KVCHAT_MODEL_H
#define KVCHAT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "engine/gguf.h"
#include "engine/tokenizer.h"

enum model_arch { ARCH_LLAMA, ARCH_GEMMA3 };

typedef struct model_hparams {
    enum model_arch arch;
    int32_t n_vocab;
    int32_t n_ctx_train;
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;          /* key and value head size (kvchat requires them equal) */
    int32_t n_ff;
    float rope_base;           /* global layers */
    float rope_base_swa;       /* sliding-window layers (gemma3) */
    float rope_freq_scale;     /* 1 / linear scaling factor */
    int32_t n_swa;             /* sliding window size; 0 = none */
    int32_t swa_pattern;
    float norm_eps;
    float final_softcap;       /* 0 = none */
    float embd_scale;          /* sqrt(n_embd) for gemma3, 1 for llama */
    float attn_scale;          /* multiplies q before q.k */
    int rope_neox;             /* pairs (i, i+d/2) instead of (2i, 2i+1) */
    int gelu;                  /* GeGLU (gemma3) instead of SwiGLU */
    int post_norms;            /* gemma3: post-attention and post-FFN norms, QK-norm */
} model_hparams;

typedef struct model_layer {
    be_weight wq, wk, wv, wo, w_gate, w_up, w_down;
    float *attn_norm, *ffn_norm;
    float *q_norm, *k_norm, *post_attn_norm, *post_ffw_norm;   /* gemma3 only */
    int is_swa;
    float rope_base;
} model_layer;

typedef struct model {
    char *path;
    gguf_file *gguf;
    model_hparams hp;
    be_weight tok_embd;
    be_weight output;          /* == tok_embd when tied */
    float *output_norm;
    model_layer *layers;
    tok_vocab *vocab;
    uint64_t weight_bytes;     /* bytes of tensor data the forward pass reads (mapped, not copied) */
    char arch_name[32];
    char name[128];            /* general.name, if present */
} model;

typedef struct model_load_opts {
    const char *tokenizer_path;   /* optional SentencePiece .model overriding the GGUF vocabulary */
} model_load_opts;

/* Load PATH. Returns 0, or -1 with a one-line message naming the file and the problem. */
int model_load(model **out, const char *path, const model_load_opts *opts, char *err, size_t errlen);
void model_free(model *m);

/* The weights the forward pass multiplies (seven a layer and the output), what a device backend
 * copies at load: up to cap of them into out; returns how many there are (7 * n_layer + 1). */
int model_matmul_weights(const model *m, const be_weight **out, int cap);
/* The vectors the forward pass gives the norms (be_ops.constants: unchanged while the model is
 * loaded): up to cap of them into out; returns how many there are. */
int model_constants(const model *m, be_range *out, int cap);

/* A quick identity of a model file (16 hex digits): FNV-1a over its size and its first and last
 * MiB, which hold the header, the tokenizer and tensor data. Names calibration files; snapshots
 * check the full sha256. 0, or -1 with a message. */
int model_fingerprint(const char *path, char out[17], char *err, size_t errlen);

#endif
