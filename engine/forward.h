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

#include "kernels/backend.h"
#include "engine/kvcache.h"
#include "engine/model.h"

typedef struct fwd_ctx fwd_ctx;

/* Called with the logits (n_vocab floats) after the token at position pos, when all logits are wanted. */
typedef void (*fwd_logits_fn)(void *ud, int64_t pos, const float *logits);
/* Progress during long prefills: tokens done of total. */
typedef void (*fwd_progress_fn)(void *ud, int64_t done, int64_t total);

typedef struct fwd_opts {
    int64_t n_ctx;           /* context limit (<= 0: the model's training context) */
    int n_batch;             /* prefill chunk size (<= 0: 512) */
    int page_size;           /* KV cache page size in tokens (<= 0: 32) */
} fwd_opts;

fwd_ctx *fwd_create(const model *m, be_backend *b, const fwd_opts *o, char *err, size_t errlen);
void fwd_free(fwd_ctx *f);
/* A context over src's model and backend whose cache is a fork of src's (kv_fork: pages shared,
 * copied on write), its chunks n_batch tokens (small: a fork decodes). Free it before src's
 * backend. NULL with a message. */
fwd_ctx *fwd_fork(fwd_ctx *src, int n_batch, char *err, size_t errlen);

/* Run n tokens starting at the current position. If logits_last is not NULL it receives the logits of
 * the last token; if each is not NULL it is called for every token. Fails (nothing appended) when the
 * tokens would not fit in the context, or when *abort becomes nonzero (checked before every layer;
 * the cache is then rewound to where it was, so a cancelled prefill leaves no trace). This is
 * prefill: every layer attends to every page it holds, and the prefill policy (if any) runs at
 * each chunk boundary. */
int fwd_eval(fwd_ctx *f, const int32_t *tokens, int64_t n, float *logits_last, fwd_logits_fn each, void *ud,
             fwd_progress_fn progress, void *pud, volatile sig_atomic_t *abort_flag, char *err, size_t errlen);

/* One decode step: the token at the current position, through the decode policy's selection (if
 * any). Same failure contract as fwd_eval. */
int fwd_decode(fwd_ctx *f, int32_t token, float *logits, volatile sig_atomic_t *abort_flag, char *err, size_t errlen);

/* One decode step whose logits stay with the backend: its pick (be_pick: the caller fills the
 * penalty, k, the entropy wanted and the outputs; this fills the row) answers with the best
 * candidates, and a device sends back those instead of the row. Needs fwd_can_pick. Same failure
 * contract as fwd_decode. */
int fwd_can_pick(const fwd_ctx *f);
int fwd_decode_pick(fwd_ctx *f, int32_t token, be_pick *pick, volatile sig_atomic_t *abort_flag, char *err,
                    size_t errlen);
/* The whole row of the last step, when fwd_decode_pick was the last evaluation (and no rewind came
 * after it): the logits fwd_decode would have given. 0, or -1 with a message. */
int fwd_picked_logits(fwd_ctx *f, float *logits, char *err, size_t errlen);

/* The most sequences one batched decode step runs. */
#define FWD_BATCH_MAX 8

/* One decode step of n sequences at once (1 <= n <= FWD_BATCH_MAX, distinct, each over lead's model
 * and backend): ids[s] at seqs[s]'s next position, through seqs[s]'s decode policy, the products
 * of all n rows at once through lead's scratch (lead's own cache is not touched; it may not be one
 * of seqs). Each sequence gets what fwd_decode (logits[s], n_vocab floats) or, with picks,
 * fwd_decode_pick (picks[s]; fwd_picked_logits then reads its row until lead's next step) would
 * have given it alone: the same floats on the CPU backend. Fails as fwd_decode, every sequence's
 * cache then as before. */
int fwd_decode_batch(fwd_ctx *lead, fwd_ctx *const *seqs, int n, const int32_t *ids, float *const *logits,
                     be_pick *picks, volatile sig_atomic_t *abort_flag, char *err, size_t errlen);

int64_t fwd_pos(const fwd_ctx *f);          /* tokens seen (the next position) */
int64_t fwd_n_ctx(const fwd_ctx *f);
/* Forget everything from pos on. Returns pos, or an earlier position (0) when sliding-window layers
 * no longer hold what pos needs: re-evaluate the tokens from the returned position. */
int64_t fwd_rewind(fwd_ctx *f, int64_t pos);
/* Keep rewinds to pos exact (see kv_set_floor): chat sets it to the start of the current turn. */
void fwd_set_floor(fwd_ctx *f, int64_t pos);
/* A second protected rewind target (see kv_set_mark; -1: none): the answer loop's page start. */
void fwd_set_mark(fwd_ctx *f, int64_t pos);
const kv_cache *fwd_kv(const fwd_ctx *f);
/* The cache itself, for snapshot restore (which replaces its contents). */
kv_cache *fwd_cache(fwd_ctx *f);
/* Every layer's list of every page handed to a device backend now (be_ops.place_pages), and the
 * policies' summaries (pol_set_place), so the next steps send only what changed: after a snapshot
 * restore, the cache goes to the device then, not with the first question. Nothing to do on a
 * backend without device copies. */
void fwd_place_pages(fwd_ctx *f);
const model *fwd_model(const fwd_ctx *f);
uint64_t fwd_scratch_bytes(const fwd_ctx *f);

/* Policies: fill env to create a pol_set for this sequence, then attach it (NULL: full attention).
 * The caller owns the pol_set and frees it after the fwd_ctx stops using it. */
struct pol_env;
struct pol_set;
void fwd_policy_env(fwd_ctx *f, struct pol_env *env);
void fwd_set_policy(fwd_ctx *f, struct pol_set *ps);
struct pol_set *fwd_policy(const fwd_ctx *f);
/* Attach a decode-time policy set to a sequence whose first n tokens (ids) are in the cache already:
 * it sees their ids and the end of their prefill as if it had been attached during it (a decode-time
 * policy does not change the cache while a prompt is prefilled, so one prefill serves several;
 * kvchat eval shares it). 0, or -1 with a message when a policy fails. */
int fwd_adopt_policy(fwd_ctx *f, struct pol_set *ps, const int32_t *ids, int64_t n, char *err, size_t errlen);

#endif
