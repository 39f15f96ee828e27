/* tasks.h - the generated tasks of `kvchat eval` (docs/eval.md): filler text, documents with planted
 * needles at chosen depths, their questions and expected answers, and the answer checker.
 *
 * Everything here is text in, text out and deterministic for a seed (a 64-bit LCG, no libc rand);
 * nothing runs a model. The filler is the King James Bible when the Debian package bible-kjv is
 * installed (its `bible` program prints the text of bible-kjv-text), else the project's own sentence
 * generator (docgen.c). */
#ifndef KVCHAT_TASKS_H
#define KVCHAT_TASKS_H

#include <stddef.h>
#include <stdint.h>

enum { TASK_MAX_Q = 4, TASK_MAX_VALS = 4 };

/* How an answer is scored. */
enum {
    TASK_NUMBERS,   /* every expected number appears in the answer as a whole digit run */
    TASK_PLACE,     /* the first place word of the task's list in the answer is the expected one */
    TASK_LOGLIK     /* no answer: the continuation's perplexity under teacher forcing */
};

typedef struct filler {
    char *text;          /* long running text, sentences separated by spaces */
    size_t len;
    char source[48];     /* "kjv" or "generated" */
} filler;

/* which: "auto" (the Bible when installed, else generated, with *note set to why), "kjv" (an error
 * when not installed) or "generated". 0, or -1 with a one-line message. */
int filler_load(filler *f, const char *which, const char **note, char *err, size_t errlen);
/* The generated filler alone (what "generated" gives): n_chars of docgen sentences from seed. */
int filler_generated(filler *f, size_t n_chars, uint64_t seed);
void filler_done(filler *f);

typedef struct task_item {
    char *doc;                                     /* the document (malloc'd) */
    char *cont;                                    /* TASK_LOGLIK: the text that follows (malloc'd) */
    int kind;                                      /* TASK_NUMBERS, TASK_PLACE, TASK_LOGLIK */
    int n_q;                                       /* questions, asked in turn about one document */
    char question[TASK_MAX_Q][128];
    char expect[TASK_MAX_Q][TASK_MAX_VALS][24];    /* values an answer must hold */
    int n_expect[TASK_MAX_Q];
    double depth[TASK_MAX_Q];                      /* where question q's needle starts, 0..1 of the document;
                                                      -1 when the task has none (ppl) */
} task_item;

/* The task names eval knows, NULL-terminated. */
const char *const *task_names(void);
int task_known(const char *name);
/* Answer tokens a task needs by default (a multi-value answer lists several numbers). */
int task_answer_tokens(const char *name);
/* Depths of the needle-in-a-haystack sweep: sample k of a sweep of n_depths points sits at
 * k mod n_depths / (n_depths - 1). */
double task_sweep_depth(int sample, int n_depths);

/* The sweep of passkey-std, which stays inside the document: sample k sits in the middle of slice
 * k mod n_depths of n_depths equal slices (10%, 30%, .. 90% for 5). */
double task_inner_depth(int sample, int n_depths);
/* The text a task repeats as its own filler (passkey-std: the standard pass-key filler), for measuring
 * its characters per token; NULL when the task cuts its documents from the loaded filler. */
const char *task_own_filler(const char *name);

/* Sample `sample` of task `name` with a document of about ctx_tokens tokens: ctx_tokens x
 * chars_per_token characters of filler f (the passkey task keeps its own generator, ctx_tokens / 11
 * sentences, so its documents are the same as before this harness; passkey-std repeats its own filler,
 * so chars_per_token must be measured on task_own_filler). 0, or -1 with a message
 * (unknown task, out of memory). task_item_free releases it. */
int task_make(const char *name, const filler *f, int64_t ctx_tokens, double chars_per_token, uint64_t seed,
              int sample, int n_depths, task_item *it, char *err, size_t errlen);
void task_item_free(task_item *it);

/* Score answer against question q of it: 1 right, 0 wrong. */
int task_check(const task_item *it, int q, const char *answer);
/* The checker's rules on their own (the item only supplies kind and values). */
int task_numbers_present(const char *answer, const char *const *values, int n);
int task_first_place_is(const char *answer, const char *place);

#endif
