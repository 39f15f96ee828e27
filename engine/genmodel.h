/* genmodel.h - random-weight models of real shapes, written as GGUF files (`kvchat gen-model`).
 *
 * A shape is a real model's hyperparameters (Gemma 3 270M, Mistral 7B, Llama 3 8B, and the two tiny
 * test shapes); the vocabulary (every tokenizer.* entry) is copied from another GGUF, so kvchat and a
 * peer engine read the very same file. Weights are N(0, 0.02) from a generator seeded per tensor
 * row (the same seed gives the same file, and the same weights in every type mix), norms are 1; the
 * tensors are produced and written a block of rows at a time on several threads, so a 15 GB file
 * never is held in memory. Type mixes: f16, q8_0, and q4_k_m with the reference quantizer's
 * per-tensor choices (gen_weight_type). Library code: no printing; progress through a callback. */
#ifndef KVCHAT_GENMODEL_H
#define KVCHAT_GENMODEL_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct gen_shape {
    const char *name;       /* as --shape names it: "mistral-7b" */
    const char *arch;       /* "llama" or "gemma3" */
    const char *title;      /* general.name */
    int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff;
    uint32_t n_ctx;         /* training context */
    float rope_base;
    uint32_t window;        /* gemma3: sliding window of the local layers (0: none) */
    float rms_eps;
    int tied;               /* no output matrix: the token embedding is the output */
} gen_shape;

int gen_n_shapes(void);
const gen_shape *gen_shape_at(int i);
/* NULL for an unknown name. */
const gen_shape *gen_find_shape(const char *name);

enum gen_mix { GEN_F16, GEN_Q8_0, GEN_Q4_K_M };
/* "f16", "q8_0", "q4_k_m" (any case). 0, or -1. */
int gen_parse_mix(const char *s, enum gen_mix *out);
const char *gen_mix_name(enum gen_mix m);

/* The type the reference quantizer gives the 2-D weight `name` (token_embd, output, or blk.L.ROLE)
 * of a model with n_layer layers in mix m: Q4_K_M is Q4_K, with Q6_K for attn_v and ffn_down of the
 * layers that get more bits (the first and last eighth and every third between) and for the output
 * (the embedding when the output is tied), and the 32-element fallbacks (Q4_K -> Q5_0, Q6_K -> Q8_0)
 * where the row length ne0 is not a multiple of 256. */
uint32_t gen_weight_type(enum gen_mix m, const char *name, int layer, int n_layer, int64_t ne0, int tied);

typedef struct gen_request {
    const gen_shape *shape;
    enum gen_mix mix;
    const char *vocab_path;  /* a GGUF whose tokenizer.* entries are copied */
    const char *out_path;
    uint64_t seed;
    int overwrite;           /* replace an existing out_path */
    int n_threads;           /* <= 0: every core */
    volatile sig_atomic_t *abort_flag;   /* set (Ctrl-C): stop before the next block of rows; NULL: never */
    FILE *out_stream;        /* not NULL: the file goes here (out_path names it in messages; overwrite unused) */
} gen_request;

/* Called after each block of rows with the tensor bytes written so far and the total. */
typedef void (*gen_progress_fn)(void *ud, uint64_t done, uint64_t total);

/* Write the model. 0; -1 with a one-line message; -2 when out_path exists and overwrite is 0; -3 when
 * stopped by the abort flag. Whatever stops it, nothing is left behind at out_path or beside it (a
 * stream holds what was written before). */
int gen_model_write(const gen_request *r, gen_progress_fn progress, void *ud, char *err, size_t errlen);

/* Write only the vocabulary of vocab_path (every tokenizer.* entry and general.architecture, no
 * tensors) to out_path, or to out_stream when not NULL; a few MB where the model may be hundreds,
 * and as good a --vocab as the model itself. *n_pieces gets the vocabulary's size. 0; -1 with a
 * one-line message; -2 when out_path exists and overwrite is 0. */
int gen_vocab_write(const char *vocab_path, const char *out_path, int overwrite, FILE *out_stream, int64_t *n_pieces,
                    char *err, size_t errlen);

#endif
