/* evalres.h - the records of `kvchat eval`: one per sample, question and configuration, written as
 * a CSV row the moment it is known, read back to resume a run (rows already there are skipped) and
 * summarised as Markdown tables. No model code: text in, text out. */
#ifndef KVCHAT_EVALRES_H
#define KVCHAT_EVALRES_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct eval_rec {
    char task[16];
    int64_t ctx;              /* the length asked for (--ctx), which resume keys on */
    int64_t tokens;           /* prompt tokens the model saw */
    int sample, turn;         /* turn: the question's number in a multi-turn conversation (0 first) */
    double depth;             /* the needle's depth, 0..1 (-1: none) */
    char policy[256];         /* "nodoc": the question asked without the document (as long as a --policy spec) */
    char budget[32];          /* as given ("-": the policy has none) */
    int backtrack;
    int correct;              /* 1, 0, or -1 (nothing to score: perplexity, a refused budget) */
    int control;              /* whether the no-document answer to this question was right (-1: unknown) */
    double ppl;               /* perplexity of the continuation (ppl task; NaN otherwise) */
    char answer[256];
    char expected[96];
    int64_t answer_tokens;    /* tokens generated, or teacher-forced for ppl */
    uint64_t kv_bytes;        /* KV held at the end of the answer */
    uint64_t kv_peak;         /* largest KV held during this run (the shared prefill's for decode-time policies) */
    uint64_t kv_full;         /* what a full f16 cache of the same positions holds */
    double prefill_s, decode_s, seconds;
    char status[96];          /* "ok", or why the configuration did not run ("refused: ...") */
} eval_rec;

typedef struct eval_recs {
    eval_rec *v;
    size_t n, cap;
} eval_recs;

extern const char *const evalres_header;

void evalres_init(eval_rec *r);
int evalres_push(eval_recs *rs, const eval_rec *r);   /* 0, or -1 when out of memory */
void evalres_free(eval_recs *rs);

/* What an eval CSV may be at most (a row is ~300 bytes: millions of rows). */
#define EVALRES_MAX_BYTES ((uint64_t)1 << 30)

/* One CSV row (no header), flushed. */
void evalres_write(FILE *f, const eval_rec *r);
/* Read every row of a CSV that evalres_write wrote (columns found by the header's names, so older
 * files with fewer columns load too). A missing file is an empty set. 0, or -1 with a message. */
int evalres_read(const char *path, eval_recs *rs, char *err, size_t errlen);

/* The index of the record with this key, or -1: what resume asks before running a configuration. */
long evalres_find(const eval_recs *rs, const char *task, int64_t ctx, int sample, int turn, const char *policy,
                  const char *budget, int backtrack);

/* Markdown: the per-configuration table (runs, answered, retrieved = right with the document and
 * wrong without it, perplexity and its change against the full cache on the same samples, KV held,
 * decode speed, time); then per task that compared policies, a policy x (length, budget) table of
 * right answers, or of perplexity against the full cache for ppl; then the retrieval accuracy of
 * the question tasks per policy and budget for each length (the tasks evalres_compared). */
void evalres_summary_md(FILE *f, const eval_recs *rs);

/* Split one CSV line into at most max fields, in place (quotes and doubled quotes handled); the count. */
int evalres_split_csv(char *line, char **fld, int max);

/* 1 when some policy other than full (and the control) ran task at this length: the pooled
 * accuracy tables and plots leave out tasks only the full cache ran, so every policy is measured
 * on the same questions. */
int evalres_compared(const eval_recs *rs, const char *task, int64_t ctx);

/* Budget as a number (fraction or tokens); NaN for "-". */
double evalres_budget_value(const char *budget);

#endif
