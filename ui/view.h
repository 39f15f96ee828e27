/* view.h - what the screen draws of the engine: the status bar's and the side panel's figures
 * (memory, context, the page map of the current answer, entropy history, settings), copied from the
 * session by the worker thread so the screen never reads engine state itself. */
#ifndef KVCHAT_UI_VIEW_H
#define KVCHAT_UI_VIEW_H

#include <stdint.h>

#include "engine/session.h"

#define UW_MAP_MAX 4096      /* pages drawn in the page map */
#define UW_HIST 512          /* entropy values kept for the sparkline */

/* What the running job is doing, for the status bar. */
enum { VIEW_IDLE, VIEW_PREFILL, VIEW_ANSWER, VIEW_COMPARE, VIEW_OTHER };

/* What the side panel shows, copied out under the worker's mutex. */
typedef struct uw_view {
    char model[128], doc[256], policy[256];
    char device[128];        /* what runs the model: the GPU's name, or "CPU (2 threads)" */
    char title[256];         /* the conversation's title (the session's) */
    int busy;                /* a job is running */
    int phase;               /* VIEW_*: what it is doing now */
    double phase_start;      /* when that began (CLOCK_MONOTONIC seconds) */
    int64_t done, total;     /* VIEW_PREFILL: tokens evaluated of total */
    int64_t answer_tokens;   /* VIEW_ANSWER, VIEW_COMPARE: the answer's final tokens so far */
    int column, n_columns;   /* VIEW_COMPARE: the column that got the last token, of how many */
    int policy_pending;      /* the policy acts from the next answer (or document) */
    int base_model;          /* no chat template: answers complete "Question: ... Answer:" */
    int have_doc;
    int64_t ctx_used, ctx_limit, doc_tokens;
    int64_t tokens_kept, tokens_full;   /* token rows held vs a full cache (all layers and KV heads) */
    uint64_t kv_held, kv_full, kv_peak;
    int swa_window;          /* the model's sliding-window layers hold this many tokens (0: it has none) */
    double rss_mib, weights_mib;
    uint64_t gpu_held, gpu_total;   /* device memory of a GPU backend (gpu_total 0: on the CPU) */
    double tok_s, prefill_tok_s;
    int64_t map[UW_MAP_MAX]; /* how often the current answer attended each page of the sequence
                                (summed over global layers and KV heads; capped at UW_MAP_MAX pages) */
    unsigned char held[UW_MAP_MAX];   /* the page still holds tokens (first global layer): 0 evicted */
    int64_t n_map;
    int64_t map_full;        /* what map[i] is when a page was attended at every step, layer and head */
    int page_size;
    float entropy[UW_HIST], varentropy[UW_HIST];
    int n_hist;
    double thr_h, thr_v;
    int thr_valid;
    int events, regenerated;
    int64_t session_id;      /* the session the conversation is saved in (0: none) */
    samp_params sp;          /* the sampling settings the next answer uses */
    int64_t n_predict;       /* the longest answer, in tokens */
    char budget[32];         /* --budget, "" when each policy's own applies */
} uw_view;

/* The page map as an answer began, so the view shows that answer's attendance alone. */
typedef struct view_marks {
    int64_t *map;
    int64_t n_map, steps;
    const pol_set *ps;           /* the policies it was taken under (another set starts afresh) */
} view_marks;

/* Take the marks now (before an answer). */
void view_mark(view_marks *m, const pol_set *ps);
void view_marks_free(view_marks *m);
/* Fill o from s (with_settings: also the sampling settings and answer length). */
void view_fill(uw_view *o, const session *s, const view_marks *m, int with_settings);

#endif
