/* uncertainty.h - the uncertainty monitor: entropy and varentropy of every generated token, their
 * statistics per generated page (P tokens) and over a rolling window, the calibrated thresholds
 * that decide when a page is too uncertain, and the log of backtracking events.
 *
 * Per token t: H_t = -sum p ln p and V_t = sum p (ln p + H_t)^2 of the sampling distribution.
 * Per page (or window) of tokens: mean H and the variance of the per-token H (the CHESS paper's
 * Var(H)_p). A page crosses the thresholds when both statistics exceed theirs (the paper's Fig. 4). The
 * monitor keeps every token of the current answer so the UI can draw sparklines. */
#ifndef KVCHAT_UNCERTAINTY_H
#define KVCHAT_UNCERTAINTY_H

#include <stddef.h>
#include <stdint.h>

/* Mean and (population) variance of n per-token entropies. */
typedef struct unc_stats {
    double mean_h, var_h;
    int64_t n;
} unc_stats;

void unc_stats_of(const float *h, int64_t n, unc_stats *out);
/* The q-quantile (0..1) of v[0..n) by linear interpolation between order statistics (sorts v). */
double unc_quantile(double *v, int64_t n, double q);

/* A calibrated per-head figure: Chelsea's key similarity of layer `layer`, KV head `head`. */
#define UNC_MAX_HEADS 2048
typedef struct unc_head_sim {
    int16_t layer, head;
    float sim;
} unc_head_sim;

/* Calibrated thresholds of one model (and the per-head key similarity the same run measured). */
typedef struct unc_thresholds {
    int valid;
    double h_mean, h_var;     /* a page is uncertain when mean H > h_mean or Var(H) > h_var */
    double quantile;          /* the quantile they were taken at (0.99) */
    int page;                 /* page size in tokens the statistics were taken over */
    int64_t samples;          /* windows the calibration saw */
    uint64_t seed;
    char model[256];          /* model file name, for the reader */
    char fingerprint[32];     /* model identity (model_fingerprint) */
    char source[512];         /* where they came from (file path, or "command line") */
    int n_heads;              /* entries of head_sim (global layers' KV heads) */
    unc_head_sim head_sim[UNC_MAX_HEADS];
} unc_thresholds;

int unc_crosses(const unc_thresholds *t, const unc_stats *s);
/* Text file of key=value lines (head_similarity=LAYER:HEAD:SIM ...). 0, or -1 with a one-line
 * message. */
int unc_thresholds_save(const char *path, const unc_thresholds *t, char *err, size_t errlen);
int unc_thresholds_load(const char *path, unc_thresholds *t, char *err, size_t errlen);

/* A backtracking event. Page indices are logical KV page numbers (position / P). */
#define UNC_EVENT_PAGES 16
typedef struct unc_event {
    int64_t step;             /* answer token index where the page ended */
    int64_t pos;              /* its position in the sequence */
    int64_t page;             /* generated page index within the answer */
    unc_stats stats;          /* the page that crossed */
    double thr_h, thr_v;
    int n_added, n_removed;   /* pages the reselection added / removed (lists capped) */
    int added[UNC_EVENT_PAGES], removed[UNC_EVENT_PAGES];
    int regenerated;          /* the page was rolled back and generated again */
    int recovered;            /* the regenerated page's statistics fell back under both thresholds */
    unc_stats after;          /* the regenerated page's statistics (n < P: the answer ended inside it) */
    int changed_text;         /* the regenerated page's tokens differ from the first attempt's */
    int regen_spent;          /* not regenerated because the answer's regenerations were all used (else
                               * backtracking was off: --backtrack 0, or nothing to roll back to) */
} unc_event;

/* The monitor of one answer: per-token H and V, page statistics, events. */
typedef struct unc_monitor unc_monitor;
unc_monitor *unc_create(int page, int window);
void unc_free(unc_monitor *m);
void unc_reset(unc_monitor *m);                    /* a new answer */
int unc_push(unc_monitor *m, double h, double v);  /* -1: out of memory */
void unc_drop(unc_monitor *m, int64_t n);          /* forget the last n tokens (a rollback) */
int64_t unc_count(const unc_monitor *m);
const float *unc_entropy(const unc_monitor *m);
const float *unc_varentropy(const unc_monitor *m);
int unc_page_size(const unc_monitor *m);
/* Statistics of tokens [from, from + n) of the answer, and of the rolling window (the last
 * `window` tokens, fewer at the start). */
void unc_range(const unc_monitor *m, int64_t from, int64_t n, unc_stats *out);
void unc_window(const unc_monitor *m, unc_stats *out);
int unc_add_event(unc_monitor *m, const unc_event *e);
unc_event *unc_last_event(unc_monitor *m);
const unc_event *unc_events(const unc_monitor *m, int *n);
int64_t unc_regenerated_tokens(const unc_monitor *m);   /* tokens thrown away by rollbacks */
void unc_note_regenerated(unc_monitor *m, int64_t n);

/* One line describing an event, for `ask --show-events` and logs. */
void unc_event_format(const unc_event *e, char *buf, size_t len);

#endif
