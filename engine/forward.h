/* forward.h - the transformer forward pass over a backend: batched prefill in chunks and one-token
 * decode, appending to a KV cache.
 *
 * One fwd_ctx is one sequence: it owns its KV cache and scratch buffers. The model code reads like
 * the equations in ../shared/docs/model-facts.md sections 4.3 (Gemma 3) and 5.1 (Llama). */
#ifndef KVCHAT_FORWARD_H
#define KVCHAT_FORWARD_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "kvcache.h"
#include "model.h"

typedef struct fwd_ctx fwd_ctx;

/* Called with the logits (n_vocab floats) after the token at position pos, when all logits are wanted. */
typedef void (*fwd_logits_fn)(void *ud, int64_t pos, const float *logits);
/* Progress during long prefills: tokens done of total. */
typedef void (*fwd_progress_fn)(void *ud, int64_t done, int64_t total);

typedef struct fwd_opts {
    int64_t n_ctx;           /* context limit (<= 0: the model's training context) */
    int n_batch;             /* prefill chunk size (<= 0: 512) */
} fwd_opts;

fwd_ctx *fwd_create(const model *m, be_backend *b, const fwd_opts *o, char *err, size_t errlen);
void fwd_free(fwd_ctx *f);

/* Run n tokens starting at the current position. If logits_last is not NULL it receives the logits of
 * the last token; if each is not NULL it is called for every token. Fails (nothing appended) when the
 * tokens would not fit in the context, or when *abort becomes nonzero between chunks (then the cache
 * is rewound to where it was, so a cancelled prefill leaves no trace). */
int fwd_eval(fwd_ctx *f, const int32_t *tokens, int64_t n, float *logits_last, fwd_logits_fn each, void *ud,
             fwd_progress_fn progress, void *pud, volatile sig_atomic_t *abort_flag, char *err, size_t errlen);

int64_t fwd_pos(const fwd_ctx *f);          /* tokens in the cache */
int64_t fwd_n_ctx(const fwd_ctx *f);
void fwd_rewind(fwd_ctx *f, int64_t pos);   /* forget everything from pos on */
const kv_cache *fwd_kv(const fwd_ctx *f);
uint64_t fwd_scratch_bytes(const fwd_ctx *f);

#endif
