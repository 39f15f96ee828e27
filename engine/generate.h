/* generate.h - the answer loop: sample, decode, watch uncertainty, and backtrack.
 *
 * After a prefill, gen_answer samples up to n_predict tokens. Every token's entropy and varentropy
 * go to the monitor. When a generated page (P tokens) is complete and its statistics cross the
 * thresholds, the decode policy rebuilds its selection with the current anchor (the uncertain
 * page's keys are still in the cache), generation rolls back to the start of that page (cache,
 * sampler state and monitor) and the page is generated again; at most max_regen times per answer,
 * and each page at most once (the regenerated page is kept whatever its statistics). The event is
 * logged with the statistics before and after.
 *
 * Tokens are handed to the caller only once they are final: immediately when no trigger can fire,
 * otherwise when their page has passed the check (so output never has to be taken back).
 *
 * Stop sequences end the answer where one of them begins in its text (a base model's next
 * "\nQuestion:"); the answer keeps the tokens wholly before it. Tokens whose text may be the start
 * of a stop sequence are held back until that is decided, so the stop text is never shown; an
 * answer that reaches its length (or is stopped) while holding some back leaves them out. */
#ifndef KVCHAT_GENERATE_H
#define KVCHAT_GENERATE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/forward.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"
#include "engine/uncertainty.h"

/* What the loop drives: the sequence, its sampler, the vocabulary (end of generation, stop text),
 * the monitor, the logits of the last evaluated token (n_vocab: the answer's first token is drawn
 * from them; after that a backend that picks keeps each step's logits and sends its best
 * candidates, and this row is filled only when they do not settle the draw), the abort flag. */
typedef struct gen_ctx {
    fwd_ctx *f;
    samp *s;
    const tok_vocab *v;
    unc_monitor *mon;
    float *logits;
    int32_t n_vocab;
    volatile sig_atomic_t *abort_flag;
} gen_ctx;

typedef struct gen_opts {
    int64_t n_predict;
    int32_t prev_token;              /* the last prompt token (re-decoded to regenerate page 0) */
    const unc_thresholds *thr;       /* NULL or invalid: monitor only, never trigger */
    int max_regen;                   /* R: regenerations per answer (0: monitor only) */
    float temperature;               /* of the sampling distribution the entropy is taken from */
    int monitor;                     /* keep per-token statistics even without thresholds (a UI shows
                                        them); without either, no entropy is computed (1 ms a token
                                        over a 262k vocabulary) */
    const char *const *stop;         /* stop sequences (n_stop of them, non-empty), or NULL */
    int n_stop;
} gen_opts;

typedef struct gen_callbacks {
    void *ud;
    void (*token)(void *ud, int32_t id);                     /* a final answer token */
    void (*page)(void *ud, int64_t page, const unc_stats *s); /* a generated page completed its check */
    void (*event)(void *ud, const unc_event *e);             /* an event, once its regeneration ended */
} gen_callbacks;

typedef struct gen_result {
    int64_t n_gen;                   /* final answer tokens */
    int64_t n_decoded;               /* decode steps run, regenerations included */
    int stop;                        /* why it stopped */
    int events, regenerated;         /* pages that crossed; pages generated again */
} gen_result;

enum { GEN_STOP_LIMIT, GEN_STOP_EOG, GEN_STOP_CONTEXT, GEN_STOP_INTERRUPT, GEN_STOP_SEQUENCE };

/* c->logits: the prefill's last logits (overwritten). The monitor is reset first. 0, or -1 with a
 * message when a decode step fails (an interrupt is not a failure: stop says so). With stop
 * sequences the cache may hold more than the n_gen tokens kept (after GEN_STOP_SEQUENCE, or when the
 * answer was cut short while text that may begin one was held back, which is then left out): the
 * caller rewinds it. */
int gen_answer(const gen_ctx *c, const gen_opts *o, const gen_callbacks *cb, gen_result *res, char *err, size_t errlen);

/* n answers at once (1 <= n <= FWD_BATCH_MAX), answer s as gen_answer(&cs[s], &os[s], &cbs[s],
 * &res[s]) would give it alone, their decode steps run as one batch through lead's scratch
 * (fwd_decode_batch: lead is none of the answers' sequences; its cache is not touched); an answer
 * that ends leaves the batch, the others go on. Each answer stops at its own abort flag
 * (cs[s].abort_flag) as gen_answer does, seen between steps (one raised during a step, from
 * another thread, stops its answer after that step); abort_flag (NULL: none) stops the batch's
 * step mid-way, every answer then stopped as interrupted. cbs may be NULL. 0, or -1 with a message when a step fails
 * (every answer then stops, keeping what it generated). */
int gen_answer_batch(fwd_ctx *lead, const gen_ctx *cs, int n, const gen_opts *os, const gen_callbacks *cbs,
                     gen_result *res, volatile sig_atomic_t *abort_flag, char *err, size_t errlen);

#endif
