/* evalplot.h - the PNG plots of `kvchat eval` and `kvchat bench`, drawn by gnuplot (gnuplot-nox):
 * the script, with its data inline, is piped to a gnuplot process. Plotting is never the point of a
 * run: a missing gnuplot is an error message the caller reports, and the CSV stays. */
#ifndef KVCHAT_EVALPLOT_H
#define KVCHAT_EVALPLOT_H

#include <stddef.h>

#include "app/eval/evalres.h"

enum { PLOT_MAX_POINTS = 64 };

typedef struct plot_series {
    char name[128];
    int n;
    double x[PLOT_MAX_POINTS], y[PLOT_MAX_POINTS];
} plot_series;

typedef struct plot_panel {
    char title[160], xlabel[64], ylabel[64];
    int logx;
    int tics_at_points;     /* x tics at the points' x values (the budgets), not gnuplot's own */
    double xmin, xmax;      /* both 0: gnuplot's own range */
    double ymin, ymax;      /* both 0: gnuplot's own range */
    const plot_series *s;
    int ns;
} plot_panel;

/* The gnuplot command that puts the x tics at the distinct x values of p's points, labelled as
 * written ("set xtics (\"0.05\" 0.05, \"0.1\" 0.1)"), into buf; "set xtics autofreq" when p does
 * not ask for it or has no points. At most 16 tics (gnuplot's own beyond). */
void evalplot_xtics(const plot_panel *p, char *buf, size_t cap);

/* One PNG of n panels side by side (cols per row), each a line per series. 0, or -1 with a message. */
int evalplot_lines(const char *png, const plot_panel *p, int n, int cols, char *err, size_t errlen);

/* Add (x, y) to the series called name (created when new; at most max series, x kept sorted). */
void evalplot_add(plot_series *s, int *ns, int max, const char *name, double x, double y);

/* The mean of the values collected per (series, x) before they become points: v added to the entry
 * for (name, x), created when new (at most max). A NaN x (no budget) is one key like any other. */
typedef struct plot_mean {
    char name[128];
    double x, sum;
    int n;
} plot_mean;
void evalplot_mean_add(plot_mean *a, int *na, int max, const char *name, double x, double v);

/* Every eval plot into dir, from the records: accuracy_vs_budget.png (retrieval over the question
 * tasks, a panel per length), niah_heatmap_<budget>.png (needle depth x length per policy, one file
 * per budget), ppl_vs_budget.png (perplexity change against the full cache), speed_memory.png
 * (decode tok/s, KV held and peak KV against length per policy, at speed_budget). n_depths: the sweep's
 * points. Writes the names of the files made into made (comma-separated). 0, or -1 with a message. */
int evalplot_eval(const eval_recs *rs, const char *dir, int n_depths, const char *speed_budget, char *made,
                  size_t made_cap, char *err, size_t errlen);

#endif
