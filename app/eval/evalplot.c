/* evalplot.c - gnuplot scripts for the eval and bench plots, with their data inline (datablocks),
 * piped to one gnuplot process per PNG. */
#include "app/eval/evalplot.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "common/files.h"
#include "engine/policy/policy.h"

/* gnuplot strings are single-quoted: a quote inside is doubled */
static void gp_str(FILE *g, const char *s)
{
    fputc('\'', g);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', g);
        fputc(*s, g);
    }
    fputc('\'', g);
}

/* gnuplot draws into a new temporary file beside png, moved over png when it succeeds (common/files.h:
 * a link at png is replaced, never followed; a FIFO or device is refused). */
static FILE *gp_open(const char *png, files_atomic *fa, int w, int h, char *err, size_t errlen)
{
    for (const char *c = png; *c; c++)
        if ((unsigned char)*c < 0x20) {   /* a newline would end gnuplot's command */
            snprintf(err, errlen, "%s: gnuplot cannot write to a path holding control characters", png);
            return NULL;
        }
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        snprintf(err, errlen, "gnuplot is not installed (apt-get install gnuplot-nox): no plots drawn");
        return NULL;
    }
    if (files_atomic_open(fa, png, err, errlen)) return NULL;
    FILE *g = popen("gnuplot 2>/dev/null", "w");
    if (!g) {
        snprintf(err, errlen, "cannot run gnuplot");
        files_atomic_abort(fa);
        return NULL;
    }
    fprintf(g, "set terminal pngcairo size %d,%d font 'sans,9'\nset output ", w, h);
    gp_str(g, fa->tmp);
    fputc('\n', g);
    return g;
}

static int gp_close(FILE *g, files_atomic *fa, const char *png, char *err, size_t errlen)
{
    fputs("unset multiplot\nset output\n", g);
    int st = pclose(g);
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        snprintf(err, errlen, "%s: gnuplot failed", png);
        files_atomic_abort(fa);
        return -1;
    }
    return files_atomic_commit(fa, err, errlen);
}

void evalplot_add(plot_series *s, int *ns, int max, const char *name, double x, double y)
{
    int k;
    for (k = 0; k < *ns; k++)
        if (!strcmp(s[k].name, name)) break;
    if (k == *ns) {
        if (*ns == max) return;
        memset(&s[k], 0, sizeof s[k]);
        snprintf(s[k].name, sizeof s[k].name, "%s", name);
        (*ns)++;
    }
    plot_series *p = &s[k];
    if (p->n == PLOT_MAX_POINTS) return;
    int i = p->n++;
    while (i > 0 && p->x[i - 1] > x) {   /* keep x sorted so lines run left to right */
        p->x[i] = p->x[i - 1];
        p->y[i] = p->y[i - 1];
        i--;
    }
    p->x[i] = x;
    p->y[i] = y;
}

void evalplot_xtics(const plot_panel *p, char *buf, size_t cap)
{
    enum { MAX_TICS = 16 };
    double x[MAX_TICS];
    int n = 0, over = 0;
    for (int k = 0; p->tics_at_points && k < p->ns; k++)
        for (int i = 0; i < p->s[k].n; i++) {
            double v = p->s[k].x[i];
            int seen = 0;
            for (int j = 0; j < n; j++) seen |= x[j] == v;
            if (seen || !isfinite(v)) continue;
            if (n == MAX_TICS) over = 1;
            else x[n++] = v;
        }
    if (n == 0 || over) {
        snprintf(buf, cap, "set xtics autofreq");
        return;
    }
    for (int a = 1; a < n; a++)   /* ascending */
        for (int b = a; b > 0 && x[b] < x[b - 1]; b--) {
            double t = x[b];
            x[b] = x[b - 1];
            x[b - 1] = t;
        }
    size_t o = (size_t)snprintf(buf, cap, "set xtics (");
    for (int j = 0; j < n && o < cap; j++)
        o += (size_t)snprintf(buf + o, cap - o, "%s\"%.10g\" %.10g", j ? ", " : "", x[j], x[j]);
    if (o < cap) o += (size_t)snprintf(buf + o, cap - o, ")");
    if (o >= cap) snprintf(buf, cap, "set xtics autofreq");   /* cut short, gnuplot would refuse it */
}

/* A series' colour: its policy's place in the registry (the name up to ':' or '+'), so every plot
 * draws a policy alike whatever else it shows; k (its place in the panel) for one that names none. */
static int colour_of(const char *name, int k)
{
    char base[64];
    snprintf(base, sizeof base, "%.*s", (int)strcspn(name, ":+"), name);
    const pol_ops *op = pol_find(base);
    const pol_ops *const *reg = pol_registry();
    for (int i = 0; op && reg[i]; i++)
        if (reg[i] == op) return i;
    return k;
}

/* Series k's colour, and in *variant how many earlier series of the panel share it (other specs of
 * the same policy), which get their own dashes and points. */
static int series_style(const plot_panel *p, int k, int *variant)
{
    int c = colour_of(p->s[k].name, k);
    *variant = 0;
    for (int j = 0; j < k; j++) *variant += colour_of(p->s[j].name, j) == c;
    return c;
}

static void panel(FILE *g, const plot_panel *p, int id)
{
    for (int k = 0; k < p->ns; k++) {
        fprintf(g, "$d%d_%d << EOD\n", id, k);
        for (int i = 0; i < p->s[k].n; i++) fprintf(g, "%.6g %.6g\n", p->s[k].x[i], p->s[k].y[i]);
        fputs("EOD\n", g);
    }
    fputs("set title ", g);
    gp_str(g, p->title);
    fputs("\nset xlabel ", g);
    gp_str(g, p->xlabel);
    fputs("\nset ylabel ", g);
    gp_str(g, p->ylabel);
    fprintf(g, "\n%s\nset key outside right top\nset grid\n", p->logx ? "set logscale x" : "unset logscale x");
    if (p->xmin != 0 || p->xmax != 0) fprintf(g, "set xrange [%g:%g]\n", p->xmin, p->xmax);
    else fputs("set autoscale x\n", g);
    if (p->ymin != 0 || p->ymax != 0) fprintf(g, "set yrange [%g:%g]\n", p->ymin, p->ymax);
    else fputs("set autoscale y\n", g);
    char tics[512];
    evalplot_xtics(p, tics, sizeof tics);
    fprintf(g, "%s\n", tics);
    if (p->ns == 0) {
        fputs("set label 1 'no data' at graph 0.5, 0.5 center\nplot NaN notitle\nunset label 1\n", g);
        return;
    }
    /* twelve colours that stay apart; the full cache (the reference) black and dashed */
    static const char *const colour[12] = { "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                                            "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939" };
    fputs("plot ", g);
    for (int k = 0; k < p->ns; k++) {
        int v, c = series_style(p, k, &v), ref = !strcmp(p->s[k].name, POL_FULL);
        fprintf(g, "%s$d%d_%d using 1:2 with linespoints lw %s pt %d lc rgb '%s' dt %d title ", k ? ", " : "", id, k,
                ref ? "2.5" : "1.5", 1 + (c + 5 * v) % 12, ref ? "#000000" : colour[c % 12], ref ? 2 : 1 + v % 5);
        gp_str(g, p->s[k].name);
    }
    fputc('\n', g);
}

int evalplot_lines(const char *png, const plot_panel *p, int n, int cols, char *err, size_t errlen)
{
    if (cols < 1) cols = 1;
    int rows = (n + cols - 1) / cols;
    files_atomic fa;
    FILE *g = gp_open(png, &fa, 560 * (n < cols ? n : cols) + 180, 380 * rows, err, errlen);
    if (!g) return -1;
    fprintf(g, "set multiplot layout %d,%d\n", rows, cols);
    for (int i = 0; i < n; i++) panel(g, &p[i], i);
    return gp_close(g, &fa, png, err, errlen);
}

static int is_qa(const eval_rec *r)
{
    return r->correct >= 0 && !strcmp(r->status, "ok") && strcmp(r->policy, "nodoc");
}



static int retrieved(const eval_rec *r)
{
    return r->correct == 1 && r->control != 1;
}

/* The distinct lengths of the records, sorted. */
static int lengths(const eval_recs *rs, int64_t *ctx, int max)
{
    int n = 0;
    for (size_t i = 0; i < rs->n; i++) {
        int seen = 0;
        for (int c = 0; c < n; c++) seen |= ctx[c] == rs->v[i].ctx;
        if (!seen && n < max) ctx[n++] = rs->v[i].ctx;
    }
    for (int a = 1; a < n; a++)
        for (int b = a; b > 0 && ctx[b] < ctx[b - 1]; b--) {
            int64_t t = ctx[b];
            ctx[b] = ctx[b - 1];
            ctx[b - 1] = t;
        }
    return n;
}

void evalplot_mean_add(plot_mean *a, int *na, int max, const char *name, double x, double v)
{
    for (int i = 0; i < *na; i++)
        /* a NaN x (a run without a budget) is one key: NaN == NaN is false, which made every sample
         * of the full cache a point of its own (a line at 0% and one at 100%) */
        if ((a[i].x == x || (isnan(a[i].x) && isnan(x))) && !strcmp(a[i].name, name)) {
            a[i].sum += v;
            a[i].n++;
            return;
        }
    if (*na == max) return;
    snprintf(a[*na].name, sizeof a[*na].name, "%s", name);
    a[*na].x = x;
    a[*na].sum = v;
    a[*na].n = 1;
    (*na)++;
}

enum { MAX_SERIES = 24, MAX_ACC = 4096 };

/* Accuracy (or ppl change) against budget, a panel per length. Policies without a budget (full)
 * appear as a flat line over the budgets measured. */
static int by_budget(const eval_recs *rs, const char *png, int ppl, char *err, size_t errlen)
{
    int64_t ctx[16];
    int nc = lengths(rs, ctx, 16);
    plot_series *s = calloc((size_t)nc * MAX_SERIES, sizeof *s);
    plot_mean *a = malloc(sizeof *a * MAX_ACC);
    plot_panel p[16];
    if (!s || !a) {
        free(s);
        free(a);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int np = 0;
    for (int c = 0; c < nc; c++) {
        int na = 0, ns = 0;
        double bmin = INFINITY, bmax = -INFINITY;
        for (size_t i = 0; i < rs->n; i++) {
            const eval_rec *r = &rs->v[i];
            if (r->ctx != ctx[c] || strcmp(r->status, "ok") || !strcmp(r->policy, "nodoc")) continue;
            double b = evalres_budget_value(r->budget), v;
            if (ppl) {
                if (isnan(r->ppl) || !strcmp(r->policy, POL_FULL)) continue;
                const eval_rec *f = NULL;
                for (size_t j = 0; j < rs->n && !f; j++) {
                    const eval_rec *q = &rs->v[j];
                    if (q->ctx == r->ctx && q->sample == r->sample && !strcmp(q->task, r->task) &&
                        !strcmp(q->policy, POL_FULL) && !isnan(q->ppl))
                        f = q;
                }
                if (!f) continue;
                v = log(r->ppl / f->ppl);   /* averaged as logs: the paired geometric mean below */
            } else {
                if (!is_qa(r) || !evalres_compared(rs, r->task, r->ctx)) continue;
                v = 100.0 * retrieved(r);
            }
            if (!isnan(b)) {
                bmin = b < bmin ? b : bmin;
                bmax = b > bmax ? b : bmax;
            }
            evalplot_mean_add(a, &na, MAX_ACC, r->policy, b, v);
        }
        if (na == 0) continue;
        plot_series *S = s + (size_t)c * MAX_SERIES;
        for (int i = 0; i < na; i++) {
            double y = a[i].sum / a[i].n;
            if (ppl) y = 100.0 * expm1(y);   /* % change against the full cache, as the summary's "ppl vs full" */
            if (isnan(a[i].x)) {   /* no budget: a flat reference line */
                if (bmin > bmax) continue;
                evalplot_add(S, &ns, MAX_SERIES, a[i].name, bmin, y);
                evalplot_add(S, &ns, MAX_SERIES, a[i].name, bmax, y);
            } else {
                evalplot_add(S, &ns, MAX_SERIES, a[i].name, a[i].x, y);
            }
        }
        plot_panel *P = &p[np++];
        memset(P, 0, sizeof *P);
        snprintf(P->title, sizeof P->title, "%s, %lld tokens", ppl ? "perplexity against the full cache" :
                                                                      "retrieved (right with, wrong without the document)",
                 (long long)ctx[c]);
        snprintf(P->xlabel, sizeof P->xlabel, "budget (fraction of the context)");
        snprintf(P->ylabel, sizeof P->ylabel, "%s", ppl ? "ppl vs full cache, %" : "% of questions");
        P->logx = 1;
        P->tics_at_points = 1;   /* log-scale tics alone would label only 0.1 */
        if (!ppl) P->ymax = 100;   /* 0 to 100%: a policy at 0 stays on the plot */
        if (bmin <= bmax) {
            P->xmin = bmin / 1.5;
            P->xmax = bmax * 1.5;
        }
        P->s = S;
        P->ns = ns;
    }
    int rc = np ? evalplot_lines(png, p, np, np < 3 ? np : 3, err, errlen) : 1;
    free(s);
    free(a);
    return rc;
}

/* NIAH accuracy by depth (rows) and length (columns), a panel per policy at this budget (and the
 * full cache). */
static int heatmap(const eval_recs *rs, const char *png, const char *budget, int n_depths, char *err, size_t errlen)
{
    int64_t ctx[16];
    int nc = lengths(rs, ctx, 16);
    const char *pols[32];
    int npol = 0;
    for (size_t i = 0; i < rs->n; i++) {
        const eval_rec *r = &rs->v[i];
        if (strcmp(r->task, "niah") || !is_qa(r) || (strcmp(r->budget, budget) && strcmp(r->budget, "-"))) continue;
        int seen = 0;
        for (int k = 0; k < npol; k++) seen |= !strcmp(pols[k], r->policy);
        if (!seen && npol < 32) pols[npol++] = r->policy;
    }
    if (npol == 0) return 1;
    if (n_depths < 2) n_depths = 2;
    int cols = npol < 4 ? npol : 4, rows = (npol + cols - 1) / cols;
    files_atomic fa;
    FILE *g = gp_open(png, &fa, 330 * cols, 300 * rows + 40, err, errlen);
    if (!g) return -1;
    fprintf(g, "set multiplot layout %d,%d title 'needle in a haystack: retrieved by depth and length, budget %s'\n",
            rows, cols, budget);
    fputs("set cbrange [0:100]\nset palette defined (0 '#d7301f', 50 '#fdd49e', 100 '#1a9850')\nunset colorbox\n"
          "set xlabel 'tokens'\nset ylabel 'needle depth'\n",
          g);
    fprintf(g, "set xrange [-0.5:%d.5]\nset yrange [%d.5:-0.5]\n", nc - 1, n_depths - 1);   /* depth 0% on top */
    fputs("set xtics (", g);
    for (int c = 0; c < nc; c++) fprintf(g, "%s'%lld' %d", c ? ", " : "", (long long)ctx[c], c);
    fputs(")\nset ytics (", g);
    for (int d = 0; d < n_depths; d++) fprintf(g, "%s'%.0f%%%%' %d", d ? ", " : "", 100.0 * d / (n_depths - 1), d);
    fputs(")\nset object 1 rectangle from graph 0,0 to graph 1,1 fc rgb '#dddddd' behind\n", g);
    for (int k = 0; k < npol; k++) {
        fprintf(g, "$h%d << EOD\n", k);
        for (int c = 0; c < nc; c++)
            for (int d = 0; d < n_depths; d++) {
                int n = 0, ok = 0;
                for (size_t i = 0; i < rs->n; i++) {
                    const eval_rec *r = &rs->v[i];
                    if (r->ctx != ctx[c] || strcmp(r->task, "niah") || !is_qa(r) || strcmp(r->policy, pols[k]) ||
                        (strcmp(r->budget, budget) && strcmp(r->budget, "-")))
                        continue;
                    int bin = (int)lround(r->depth * (n_depths - 1));
                    if (bin != d) continue;
                    n++;
                    ok += retrieved(r);
                }
                if (n) fprintf(g, "%d %d %.1f %d/%d\n", c, d, 100.0 * ok / n, ok, n);
            }
        fputs("EOD\nset title ", g);
        gp_str(g, pols[k]);
        fprintf(g, "\nplot $h%d using 1:2:(0.5):(0.5):3 with boxxyerror fs solid 1.0 noborder lc palette notitle, "
                   "$h%d using 1:2:(stringcolumn(4)) with labels notitle\n",
                k, k);
    }
    return gp_close(g, &fa, png, err, errlen);
}

/* Decode tok/s, KV held and peak KV against length, a line per policy (at this budget, and the full
 * cache). */
static int speed_memory(const eval_recs *rs, const char *png, const char *budget, char *err, size_t errlen)
{
    plot_mean *a = malloc(sizeof *a * MAX_ACC), *m = malloc(sizeof *m * MAX_ACC);
    plot_mean *tok = malloc(sizeof *tok * MAX_ACC), *h = malloc(sizeof *h * MAX_ACC);
    plot_series *s = calloc(3 * MAX_SERIES, sizeof *s);
    if (!a || !m || !tok || !h || !s) {
        free(a);
        free(m);
        free(tok);
        free(h);
        free(s);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int na = 0, nm = 0, nt = 0, nh = 0, ns1 = 0, ns2 = 0, ns3 = 0;
    for (size_t i = 0; i < rs->n; i++) {
        const eval_rec *r = &rs->v[i];
        if (strcmp(r->status, "ok") || !strcmp(r->policy, "nodoc") ||
            (strcmp(r->budget, budget) && strcmp(r->budget, "-")))
            continue;
        evalplot_mean_add(a, &na, MAX_ACC, r->policy, (double)r->ctx, r->decode_s);
        evalplot_mean_add(tok, &nt, MAX_ACC, r->policy, (double)r->ctx, (double)r->answer_tokens);
        evalplot_mean_add(m, &nm, MAX_ACC, r->policy, (double)r->ctx, (double)r->kv_peak / 1048576.0);
        evalplot_mean_add(h, &nh, MAX_ACC, r->policy, (double)r->ctx, (double)r->kv_bytes / 1048576.0);
    }
    for (int i = 0; i < na; i++)   /* a and tok were filled in the same order */
        if (a[i].sum > 0) evalplot_add(s, &ns1, MAX_SERIES, a[i].name, a[i].x, tok[i].sum / a[i].sum);
    for (int i = 0; i < nh; i++) evalplot_add(s + MAX_SERIES, &ns2, MAX_SERIES, h[i].name, h[i].x, h[i].sum / h[i].n);
    for (int i = 0; i < nm; i++)
        evalplot_add(s + 2 * MAX_SERIES, &ns3, MAX_SERIES, m[i].name, m[i].x, m[i].sum / m[i].n);
    plot_panel p[3];
    memset(p, 0, sizeof p);
    snprintf(p[0].title, sizeof p[0].title, "decode speed (budget %s)", budget);
    snprintf(p[0].xlabel, sizeof p[0].xlabel, "context tokens");
    snprintf(p[0].ylabel, sizeof p[0].ylabel, "tokens/s");
    p[0].s = s;
    p[0].ns = ns1;
    snprintf(p[1].title, sizeof p[1].title, "KV held after the answer (budget %s)", budget);
    snprintf(p[2].title, sizeof p[2].title, "peak KV memory (budget %s)", budget);
    for (int k = 1; k < 3; k++) {
        snprintf(p[k].xlabel, sizeof p[k].xlabel, "context tokens");
        snprintf(p[k].ylabel, sizeof p[k].ylabel, "MiB");
        p[k].s = s + k * MAX_SERIES;
    }
    p[1].ns = ns2;
    p[2].ns = ns3;
    int rc = evalplot_lines(png, p, 3, 3, err, errlen);
    free(a);
    free(m);
    free(tok);
    free(h);
    free(s);
    return rc;
}

static void note_made(char *made, size_t cap, const char *name)
{
    size_t l = strlen(made);
    snprintf(made + l, cap - l, "%s%s", l ? ", " : "", name);
}

int evalplot_eval(const eval_recs *rs, const char *dir, int n_depths, const char *speed_budget, char *made,
                  size_t made_cap, char *err, size_t errlen)
{
    char png[1024];
    made[0] = 0;
    snprintf(png, sizeof png, "%s/accuracy_vs_budget.png", dir);
    int r = by_budget(rs, png, 0, err, errlen);
    if (r < 0) return -1;
    if (r == 0) note_made(made, made_cap, "accuracy_vs_budget.png");
    snprintf(png, sizeof png, "%s/ppl_vs_budget.png", dir);
    if ((r = by_budget(rs, png, 1, err, errlen)) < 0) return -1;
    if (r == 0) note_made(made, made_cap, "ppl_vs_budget.png");
    const char *buds[16];
    int nb = 0;
    for (size_t i = 0; i < rs->n; i++) {
        const char *b = rs->v[i].budget;
        int seen = !strcmp(b, "-");
        for (int k = 0; k < nb; k++) seen |= !strcmp(buds[k], b);
        if (!seen && nb < 16) buds[nb++] = b;
    }
    for (int k = 0; k < nb; k++) {
        char name[64];
        snprintf(name, sizeof name, "niah_heatmap_%s.png", buds[k]);
        snprintf(png, sizeof png, "%s/%s", dir, name);
        if ((r = heatmap(rs, png, buds[k], n_depths, err, errlen)) < 0) return -1;
        if (r == 0) note_made(made, made_cap, name);
    }
    if (nb == 0) {   /* only policies without a budget (full) */
        snprintf(png, sizeof png, "%s/niah_heatmap.png", dir);
        if ((r = heatmap(rs, png, "-", n_depths, err, errlen)) < 0) return -1;
        if (r == 0) note_made(made, made_cap, "niah_heatmap.png");
    }
    const char *sb = speed_budget ? speed_budget : nb ? buds[nb / 2] : "-";
    snprintf(png, sizeof png, "%s/speed_memory.png", dir);
    if (speed_memory(rs, png, sb, err, errlen)) return -1;
    note_made(made, made_cap, "speed_memory.png");
    return 0;
}
