/* run.h - the engine's runtime for one sequence: the model, the backend on the device chosen, the
 * forward context with its paged KV cache, the policy set, the sampler, the uncertainty monitor,
 * the last logits and the sequence's token ids, in one object.
 *
 * A run feeds tokens (prefill), decodes, answers (the sampling loop with backtracking), rewinds,
 * swaps policies (and back), saves and restores snapshots, and computes the figures every front
 * end shows (run_get_figures). It knows nothing of documents, turns or the store: the session
 * (session.h) is a conversation over a run; bench, eval, calibrate and logits drive a run directly.
 * Nothing here prints; a failing call returns a RUN_* code and leaves its message in err. */
#ifndef KVCHAT_RUN_H
#define KVCHAT_RUN_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/forward.h"
#include "engine/generate.h"
#include "engine/model.h"
#include "engine/policy/policy.h"
#include "engine/sampler.h"
#include "engine/uncertainty.h"

typedef struct run run;

/* What a call returns (the session's SESS_* codes have the same values). */
enum { RUN_OK = 0, RUN_EFAIL = -1, RUN_ECANCELLED = -2, RUN_ENOFIT = -3 };

typedef struct run_config {
    const char *model_path;      /* required */
    const char *tokenizer_path;  /* a SentencePiece .model replacing the file's vocabulary, or NULL */
    int device;                  /* BE_DEVICE_*: AUTO is the GPU when one is present */
    int n_threads;               /* 0: all cores */
    int64_t n_ctx;               /* 0: the model's training context */
    int n_batch;                 /* prefill chunk (0: 512) */
    int page_size;               /* KV page size (0: 32, and a restored snapshot's own size is taken) */
    pol_spec policy;             /* parsed (pol_parse); n == 0: full attention (with budget, refused) */
    const char *budget;          /* the --budget text (NULL: none), checked against a default policy */
    samp_params sp;
    unc_thresholds thr;          /* the model's calibration (valid 0: the monitor only watches) */
    int warm_up;                 /* at load, a throwaway prompt and decode step pay the backend's one-off
                                    costs (kernels loaded on first use): 0 on a device backend, 1 on any,
                                    -1 never */
} run_config;

/* Load the model, create the backend (warmed up as cfg.warm_up says), the forward context, the
 * policies, the sampler and the monitor. NULL with a message. */
run *run_create(const run_config *c, char *err, size_t errlen);
/* A second sequence over r's model and backend (its own cache, policies, sampler and monitor, from
 * the same configuration): a snapshot restored beside the first, say. Free it before r. */
run *run_sibling(run *r, char *err, size_t errlen);
/* A fork of r's sequence (its cache's pages shared, copied on write: kv_fork), with r's ids, last
 * logits and sampler state, under spec's policies (a fresh set, adopting the sequence as
 * run_adopt_policy does: decode-time policies only, then): what sess_compare
 * answers each policy in. Its chunks are small (it decodes). Free it before r. NULL with a
 * message. */
run *run_fork(run *r, const pol_spec *spec, char *err, size_t errlen);
void run_free(run *r);
/* What loading did that a front end should say once (the weight types a GPU converts; "" none). */
const char *run_load_note(const run *r);
/* A warning about the configuration ("" when none), e.g. a context above the model's training. */
const char *run_warning(const run *r);

/* Prefill progress and the flag that stops a feed or an answer (checked before every layer and
 * token); both stay until changed (NULL: none). */
void run_set_progress(run *r, fwd_progress_fn fn, void *ud);
void run_set_abort(run *r, volatile sig_atomic_t *abort_flag);

/* ---- the sequence: tokens [0, run_pos) are in the cache; ids after them (the last sampled token
 * of an answer, tokens appended) wait for the next feed. */

/* Append ids to the sequence without evaluating them. RUN_OK or RUN_EFAIL (out of memory). */
int run_append(run *r, const int32_t *ids, int64_t n, char *err, size_t errlen);
/* Append ids (n may be 0) and evaluate every waiting id: a prefill, the prefill policy acting at
 * chunk boundaries; the sampler records them for its repetition penalty; the last logits go to
 * run_logits, every position's to each (NULL: none). On failure the ids this call appended are
 * forgotten and the cache is as before. RUN_ENOFIT when they do not fit the context. */
int run_feed(run *r, const int32_t *ids, int64_t n, fwd_logits_fn each, void *ud, char *err, size_t errlen);
/* Evaluate the sequence's last id again, at its own position (its logits, to answer once more). */
int run_redo_last(run *r, char *err, size_t errlen);
/* Prefill the tokens the cache holds again from position 0 under the current policies (a prefill
 * policy switched to rebuilds the cache); waiting ids stay waiting, the sampler is left as it is. */
int run_prefill_again(run *r, char *err, size_t errlen);
/* One decode step of id (appended to the sequence) through the decode policy's selection; the
 * logits go to run_logits. The sampler does not record it (teacher forcing, benchmarks). */
int run_decode(run *r, int32_t id, char *err, size_t errlen);
/* A greedy step: run_decode, and *next the argmax of its logits (samp_argmax's), which a backend
 * that picks finds where the logits are (run_logits is then not updated). */
int run_decode_greedy(run *r, int32_t id, int32_t *next, char *err, size_t errlen);
/* One greedy step of n runs at once (1 <= n <= FWD_BATCH_MAX; forks of lead, say): ids[s] appended to
 * rs[s] and evaluated (fwd_decode_batch through lead's scratch), then replaced by the argmax
 * run_decode_greedy would give. Each run's decoding figures count the batch's time. */
int run_decode_greedy_batch(run *lead, run *const *rs, int n, int32_t *ids, char *err, size_t errlen);
/* The cache goes back to pos and the sequence keeps its first n_ids ids (pos <= n_ids <= length;
 * those after pos wait for the next feed); what sliding-window layers no longer hold is evaluated
 * again. */
int run_rewind(run *r, int64_t pos, int64_t n_ids, char *err, size_t errlen);
/* Rewinds to pos, and to any position after it, are exact (a turn's start; see fwd_set_floor). */
void run_set_floor(run *r, int64_t pos);
/* The KV peak counts again from what the cache holds now. */
void run_reset_peak(run *r);

/* ---- answering */

typedef struct run_answer_opts {
    int64_t n_predict;
    int keep;                    /* the answer joins the sequence (its last token waiting); 0: a side
                                    answer, after which the cache goes back to where it began (the
                                    caller's floor must be there) */
    int max_regen;               /* regenerations per answer (-1: run_default_backtrack) */
    int watch;                   /* check each page against the calibrated thresholds (0: never) */
    int monitor;                 /* keep each token's entropy even without thresholds (a UI draws it) */
    const char *const *stop;     /* stop sequences (n_stop of them) */
    int n_stop;
} run_answer_opts;
/* Sample an answer after the sequence's last id (which the cache holds): the final tokens go to
 * cb->token as they become final; pages, events as gen_answer reports them (generate.h). With keep
 * and a stop sequence the cache is rewound to the tokens kept. An interrupt is a stop (res->stop),
 * not a failure. */
int run_answer(run *r, const run_answer_opts *o, const gen_callbacks *cb, gen_result *res, char *err,
               size_t errlen);
/* Answers of n runs at once (1 <= n <= FWD_BATCH_MAX; forks of lead, say), each as run_answer(rs[s],
 * &os[s], &cbs[s], &res[s]) would give it alone, their decode steps batched through lead's scratch
 * (gen_answer_batch; lead's own cache is not touched; each run stops at its own abort flag, and
 * lead's stops them all). cbs may be NULL. Each run's decode time is the batch's. */
int run_answer_batch(run *lead, run *const *rs, int n, const run_answer_opts *os, const gen_callbacks *cbs,
                     gen_result *res, char *err, size_t errlen);
/* Regenerations per answer a policy calls for: 2 when the decode policy keeps a selection it can
 * rebuild (CHESS), else 0. */
int run_default_backtrack(const run *r);
/* The logits a stored copy replaces (the same prompt's, kept aside). */
void run_set_logits(run *r, const float *logits);
/* The sampler's state: its size, a copy, and the copy restored; run_reset_sampler starts it again
 * with the sequence's ids as its history. */
size_t run_sampler_state_size(const run *r);
void run_save_sampler(const run *r, void *state);
void run_load_sampler(run *r, const void *state);
void run_reset_sampler(run *r);
void run_set_sampling(run *r, const samp_params *sp);

/* ---- policies */

/* A policy set for spec bound to this sequence, not attached (NULL with a message). */
pol_set *run_new_policies(run *r, const pol_spec *spec, char *err, size_t errlen);
/* Attach ps (the run owns it from now on) and hand back the set it replaces, which the caller frees
 * or swaps back in. */
pol_set *run_swap_policies(run *r, pol_set *ps);
/* Replace the policies by spec's (the old set is freed). */
int run_set_policy(run *r, const pol_spec *spec, char *err, size_t errlen);
/* Replace the policies by spec's decode-time set, adopting the sequence the cache holds as if it
 * had been attached during its prefill (one prefill serves several; forward.h). */
int run_adopt_policy(run *r, const pol_spec *spec, char *err, size_t errlen);
/* Do the attached policies' budgets work for a sequence of len tokens? RUN_OK, or RUN_EFAIL with
 * the reason (a budget larger than the sequence, or below what a policy always keeps). */
int run_check_budget(run *r, int64_t len, char *err, size_t errlen);
/* The same for spec's policies, not attached. */
int run_check_policy(run *r, const pol_spec *spec, int64_t len, char *err, size_t errlen);
/* The next feeds end with a question of n_tokens tokens (0: no question; pol_set_question): the
 * task-aware prefill policies probe with it. Stays until changed, across policy swaps. */
void run_set_question(run *r, int64_t n_tokens);
/* Trace the policies' decisions about positions [lo, hi) (kvchat ask --trace). */
int run_trace(run *r, int64_t lo, int64_t hi, char *err, size_t errlen);

/* ---- snapshots */

/* The sequence as snapshot bytes (*data malloc'd) naming the model file by model_sha. */
int run_snapshot(const run *r, const char *model_sha, void **data, size_t *len, char *err, size_t errlen);
/* Check snapshot bytes against this sequence (model, cache shape, every section) without changing
 * anything. */
int run_check_snapshot(const run *r, const void *data, size_t len, const char *model_sha, char *err, size_t errlen);
/* Restore snapshot bytes (a cache of the snapshot's page size when none was configured). On a
 * failure the sequence is as it was, or empty when the cache had changed its page size for it. */
int run_restore(run *r, const void *data, size_t len, const char *model_sha, char *err, size_t errlen);
/* A restored cache kept: on a device backend its pages (and the policies' summaries) go to the
 * device now, without waiting (fwd_place_pages), so the next question sends none of it. Called
 * once a restore is kept, not for one that is checked and thrown away; without it the next
 * question sends them. Nothing to do on the CPU. */
void run_place(run *r);

/* ---- what the run holds, read-only */

const model *run_model(const run *r);
const pol_set *run_policies(const run *r);
const unc_monitor *run_monitor(const run *r);
const samp *run_sampler(const run *r);
const unc_thresholds *run_thresholds(const run *r);
const float *run_logits(const run *r);
const int32_t *run_tokens(const run *r, int64_t *n);
int64_t run_pos(const run *r);
int64_t run_n_ctx(const run *r);
int run_threads(const run *r);
/* 1 when the model runs on a device (a GPU). */
int run_on_device(const run *r);
/* What runs the model, in a few words for people: the GPU's name, or "CPU (2 threads)". */
void run_device(const run *r, char *buf, size_t cap);
/* The key similarity of every global layer's KV heads over the cached keys (pol_head_similarity),
 * [n_global * n_head_kv] in global-layer order, NaN where a head holds too few tokens; the global
 * layers' indices in layers (n_global of them, may be NULL). The count of heads. */
int run_head_similarity(const run *r, double *sim, int *layers, int cap);

/* Per position of the sequence: 0 evicted or merged away, 1 held, 2 attended at the last decode step,
 * in the first global layer (every position held when the model has none). */
int run_position_states(const run *r, uint8_t *state, int64_t n);

/* The figures front ends show, computed here only. */
typedef struct run_figures {
    int64_t positions;           /* the cache's length */
    int64_t n_ctx;
    int page_size;
    int64_t tokens_kept, tokens_full;   /* over every layer and KV head */
    uint64_t kv_held, kv_full, kv_peak; /* bytes: held now, a full cache of this length, the peak */
    int64_t peak_layer_tokens;   /* the most tokens a global layer's KV head held */
    int saves_memory;            /* the policies drop or merge tokens (else selection keeps every page) */
    uint64_t gpu_held, gpu_total;/* device memory (0: host only) */
    double rss_peak_mib;         /* the process's peak resident memory */
    /* decode steps since the policies were attached */
    int64_t steps;
    double pages_per_step, pages_avail_per_step;   /* per global layer and KV head */
    double kv_read_per_step;     /* bytes of K and V attention read */
    double attn_ms_per_step, select_ms_per_step;
    /* the first step's selection time, and the steps' after it (a short run's average carries the
     * first step's one-off costs: at 32K, hundreds of milliseconds) */
    double select_ms_first, select_ms_rest;
    /* the last prefill, and the decoding since it (or since the last answer began) */
    int64_t prefill_tokens, decoded;
    int64_t replayed;            /* positions rewinds had to evaluate again, since the run began */
    double prefill_s, decode_s, prefill_tok_s, decode_tok_s;
    double decode_rest_tok_s;    /* the decode steps' after the first (0: fewer than two, or an answer's) */
    /* the device backend's traffic so far (has_counters 0: none) */
    int has_counters;
    uint64_t dev_waits, dev_bytes_up, dev_bytes_down;
    double warm_up_s;            /* loading's warm-up (run_config.warm_up; 0: none ran) */
} run_figures;
void run_get_figures(const run *r, run_figures *out);
/* The monotonic clock the figures are timed with, in seconds. */
double run_clock_s(void);

#endif
