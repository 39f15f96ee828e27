/* cmd_calibrate.c - `kvchat calibrate`: the uncertainty thresholds of a model.
 *
 * Runs the model with the full cache over a calibration set (generated documents and questions, or
 * --data DIR), collects the mean entropy and the entropy variance of every window of P consecutive
 * answer tokens (the statistic the monitor checks at each page end, so both come from the same
 * distribution), and stores their q-quantiles (0.99) as the model's thresholds. Greedy decoding
 * and seeded documents: the same seed gives the same thresholds. docs/calibration.md has the
 * details. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/cli.h"
#include "app/commands.h"
#include "app/eval/docgen.h"
#include "common/files.h"
#include "common/text.h"
#include "engine/prompt.h"
#include "store/persist.h"
#include "store/store.h"

typedef struct calib_set {
    char **docs;               /* document paths (--data) */
    int n_docs;
    char **questions;
    int n_questions;
} calib_set;

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void set_free(calib_set *cs)
{
    for (int i = 0; i < cs->n_docs; i++) free(cs->docs[i]);
    for (int i = 0; i < cs->n_questions; i++) free(cs->questions[i]);
    free(cs->docs);
    free(cs->questions);
}

static int push_str(char ***v, int *n, const char *s)
{
    char **nv = realloc(*v, sizeof(char *) * (size_t)(*n + 1));
    if (!nv) return -1;
    *v = nv;
    if (!(nv[*n] = strdup(s))) return -1;
    ++*n;
    return 0;
}

static int load_data_dir(const char *dir, calib_set *cs)
{
    DIR *d = opendir(dir);
    if (!d) {
        cli_err("calibrate: cannot open %s: %s", dir, strerror(errno));
        return -1;
    }
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d))) {
        size_t L = strlen(e->d_name);
        if (L < 5 || strcmp(e->d_name + L - 4, ".txt") || !strcmp(e->d_name, "questions.txt")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (push_str(&cs->docs, &cs->n_docs, path)) {
            closedir(d);
            cli_err("calibrate: out of memory");
            return -1;
        }
    }
    closedir(d);
    if (cs->n_docs == 0) {
        cli_err("calibrate: %s holds no *.txt documents", dir);
        return -1;
    }
    qsort(cs->docs, (size_t)cs->n_docs, sizeof *cs->docs, cmp_str);
    snprintf(path, sizeof path, "%s/questions.txt", dir);
    size_t len;
    char *q = cli_read_text_file(path, &len);
    if (!q) {
        cli_err("calibrate: %s/questions.txt (one question per line) is needed with --data", dir);
        return -1;
    }
    for (char *line = strtok(q, "\n"); line; line = strtok(NULL, "\n")) {
        line[strcspn(line, "\r")] = 0;
        if (*line && push_str(&cs->questions, &cs->n_questions, line)) {
            free(q);
            cli_err("calibrate: out of memory");
            return -1;
        }
    }
    free(q);
    if (cs->n_questions == 0) {
        cli_err("calibrate: %s has no questions", path);
        return -1;
    }
    return 0;
}

static void write_plot_data(FILE *f, const double *mh, const double *vh, int64_t n, double xmax, double ymax)
{
    enum { NB = 48 };
    static int64_t hist[NB][NB];
    memset(hist, 0, sizeof hist);
    for (int64_t i = 0; i < n; i++) {
        int bx = (int)(mh[i] / xmax * NB), by = (int)(vh[i] / ymax * NB);
        if (bx >= NB) bx = NB - 1;
        if (by >= NB) by = NB - 1;
        hist[bx][by]++;
    }
    /* gnuplot's `with image` wants x, y, value on a regular grid, rows separated by blank lines */
    for (int by = 0; by < NB; by++) {
        for (int bx = 0; bx < NB; bx++)
            fprintf(f, "%.6g %.6g %lld\n", (bx + 0.5) * xmax / NB, (by + 0.5) * ymax / NB, (long long)hist[bx][by]);
        fputc('\n', f);
    }
}

/* t as a gnuplot single-quoted string's contents: quotes doubled, control characters as '?' (a
 * model file's name is not a gnuplot command). */
static void gp_quote(const char *t, char *out, size_t cap)
{
    size_t n = 0;
    for (; *t && n + 3 < cap; t++) {
        if (*t == '\'') out[n++] = '\'';
        out[n++] = (unsigned char)*t < 0x20 || *t == 0x7f ? '?' : *t;
    }
    out[n] = 0;
}

/* The plot, drawn by gnuplot into a private directory of ours (gnuplot never opens the user's path,
 * which may be a link, and no path goes into its script), then copied to png as files are written
 * (common/files.h: a link there is replaced, not followed; a FIFO or device is refused). 0, or -1
 * with a message in err ("" when gnuplot failed). */
static int draw_plot(const char *png, const double *mh, const double *vh, int64_t n, const unc_thresholds *t, char *err,
                     size_t errlen)
{
    err[0] = 0;
    double xmax = t->h_mean * 1.5, ymax = t->h_var * 1.5;
    for (int64_t i = 0; i < n; i++) {
        if (mh[i] * 1.05 > xmax) xmax = mh[i] * 1.05;
        if (vh[i] * 1.05 > ymax) ymax = vh[i] * 1.05;
    }
    if (xmax <= 0) xmax = 1;
    if (ymax <= 0) ymax = 1;
    char dir[] = "/tmp/kvchat-calib-XXXXXX", dat[64], out[64], title[600];
    if (!mkdtemp(dir)) return -1;
    snprintf(dat, sizeof dat, "%s/windows.dat", dir);
    snprintf(out, sizeof out, "%s/plot.png", dir);
    int rc = -1;
    FILE *f = fopen(dat, "w"), *gp = NULL;
    if (!f) goto done;
    write_plot_data(f, mh, vh, n, xmax, ymax);
    if (fclose(f) != 0 || !(gp = popen("gnuplot 2>&1", "w"))) goto done;
    gp_quote(t->model, title, sizeof title);
    fprintf(gp,
            "set terminal pngcairo size 900,700 font 'sans,11' noenhanced\n"
            "set output '%s'\n"
            "set title 'kvchat calibrate: %s, %lld windows of %d answer tokens'\n"
            "set xlabel 'mean entropy of the window (nats)'\nset ylabel 'variance of the per-token entropy'\n"
            "set xrange [0:%g]\nset yrange [0:%g]\n"
            "set palette defined (0 'white', 1 '#c6dbef', 5 '#4292c6', 20 '#08306b')\n"
            "set logscale cb\nset cblabel 'windows per cell'\n"
            "set arrow from %g,0 to %g,%g nohead lw 2 lc rgb '#d62728' front\n"
            "set arrow from 0,%g to %g,%g nohead lw 2 lc rgb '#d62728' front\n"
            "set label 'thresholds (q%.0f, red): mean H %.3f, Var(H) %.3f' at graph 0.02, graph 0.95 "
            "tc rgb '#d62728' front\n"
            "plot '%s' using 1:2:($3 > 0 ? $3 : 1/0) with image notitle\nset output\n",
            out, title, (long long)n, t->page, xmax, ymax, t->h_mean, t->h_mean, ymax, t->h_var, xmax, t->h_var,
            t->quantile * 100, t->h_mean, t->h_var, dat);
    if (pclose(gp) != 0 || !(f = files_open_read(out, (uint64_t)256 << 20, "a plot", err, errlen))) goto done;
    files_atomic fa;
    if (files_atomic_open(&fa, png, err, errlen) == 0) {
        char buf[1 << 16];
        size_t k;
        while ((k = fread(buf, 1, sizeof buf, f)) > 0 && fwrite(buf, 1, k, fa.f) == k) {}
        if (ferror(f)) {
            snprintf(err, errlen, "%s: cannot read gnuplot's output", png);
            files_atomic_abort(&fa);
        } else {
            rc = files_atomic_commit(&fa, err, errlen);
        }
    }
    fclose(f);
done:
    unlink(dat);
    unlink(out);
    rmdir(dir);
    return rc;
}

typedef struct calib_opts {
    const char *data, *out, *plot;
    int64_t n_samples, n_predict;
    float quantile;
} calib_opts;

#define C(field) offsetof(calib_opts, field)
static const opt_def calib_defs[] = {
    { "--data", NULL, OPT_STR, C(data), 0, 0, NULL, 0, "DIR",
      "documents (*.txt) and questions (questions.txt, one per line) instead of the generated set", NULL },
    { "--samples", NULL, OPT_I64, C(n_samples), 1, 100000, NULL, 0, "N", "(document, question) pairs (default 24)", NULL },
    { "--n-predict", "-n", OPT_I64, C(n_predict), 1, 1 << 16, NULL, 0, "N", "answer tokens per sample at most (default 96)",
      NULL },
    { "--quantile", NULL, OPT_FLOAT, C(quantile), 0.5, 1, NULL, 0, "Q", "the quantile taken as threshold (default 0.99)",
      NULL },
    { "--out", NULL, OPT_STR, C(out), 0, 0, NULL, 0, "FILE",
      "where to write the thresholds (default: the data directory, by fingerprint)", NULL },
    { "--plot", NULL, OPT_STR, C(plot), 0, 0, NULL, 0, "PNG",
      "the density plot (default: the thresholds file with .png; none: no plot)", NULL },
    { "--help", "-h", OPT_HELP, 0, 0, 0, NULL, 0, NULL, "this help", NULL },
    OPT_END
};
#undef C

/* One calibration run: the engine, the windows' statistics so far, the heads' key similarities. */
typedef struct calib {
    run *r;                      /* full cache, no thresholds: its monitor's windows are the cache's pages */
    const model *m;
    int64_t n_predict, n_samples;
    double *mh, *vh;             /* each window's mean entropy and entropy variance */
    int64_t n_win, cap, tokens_gen;
    int n_hs;                    /* global layers' KV heads */
    int *layers;                 /* the global layers */
    double *sim;                 /* one sample's similarities */
    double *hsum;                /* per global layer and KV head: summed similarity, samples */
    int64_t *hcnt;
} calib;

static int push_window(calib *c, const unc_stats *st)
{
    if (c->n_win == c->cap) {
        int64_t nc = c->cap ? c->cap * 2 : 1024;
        double *a = realloc(c->mh, sizeof(double) * (size_t)nc);
        if (a) c->mh = a;
        double *b = a ? realloc(c->vh, sizeof(double) * (size_t)nc) : NULL;
        if (!b) return -1;
        c->vh = b;
        c->cap = nc;
    }
    c->mh[c->n_win] = st->mean_h;
    c->vh[c->n_win] = st->var_h;
    c->n_win++;
    return 0;
}

/* Sample k: the prompt with the full cache, each global KV head's key similarity, the answer's
 * windows. 0, 128 + the signal when interrupted, or 1 after printing. */
static int calib_sample(calib *c, int64_t k, char *doc, const char *question)
{
    char err[600];
    size_t n_ids = 0;
    int32_t *ids = NULL;
    int bad = prompt_conversation(c->m, prompt_has_template(c->m), doc, NULL, 0, question, &ids, &n_ids, err,
                                  sizeof err);
    free(doc);
    if (bad) {
        cli_err("calibrate: sample %lld: %s", (long long)k + 1, err);
        return 1;
    }
    if ((int64_t)n_ids + c->n_predict > run_n_ctx(c->r)) {
        cli_err("calibrate: sample %lld is %zu tokens, too long for the context of %lld with %lld answer tokens",
                (long long)k + 1, n_ids, (long long)run_n_ctx(c->r), (long long)c->n_predict);
        free(ids);
        return 1;
    }
    bad = run_rewind(c->r, 0, 0, err, sizeof err);
    run_reset_sampler(c->r);
    if (bad || run_feed(c->r, ids, (int64_t)n_ids, NULL, NULL, err, sizeof err)) {
        cli_err("calibrate: %s", cli_interrupted ? "interrupted" : err);
        free(ids);
        return cli_interrupted ? cli_interrupt_status() : 1;
    }
    free(ids);
    /* how similar each global KV head's prompt keys are (what Chelsea's outlier heads are chosen by) */
    run_head_similarity(c->r, c->sim, c->layers, c->n_hs);
    for (int i = 0; i < c->n_hs; i++)
        if (!isnan(c->sim[i])) {
            c->hsum[i] += c->sim[i];
            c->hcnt[i]++;
        }
    run_answer_opts ao = { c->n_predict, 1, 0, 0, 1, NULL, 0 };
    gen_result gr;
    if (run_answer(c->r, &ao, NULL, &gr, err, sizeof err)) {
        cli_err("calibrate: %s", err);
        return 1;
    }
    if (gr.stop == GEN_STOP_INTERRUPT) {
        cli_err("calibrate: interrupted; nothing written");
        return cli_interrupt_status();
    }
    const unc_monitor *mon = run_monitor(c->r);
    const int P = unc_page_size(mon);
    int64_t n = unc_count(mon), w0 = c->n_win;
    for (int64_t t = P; t <= n; t++) {
        unc_stats st;
        unc_range(mon, t - P, P, &st);
        if (push_window(c, &st)) {
            cli_err("calibrate: out of memory");
            return 1;
        }
    }
    c->tokens_gen += n;
    fprintf(stderr, "\rcalibrate: sample %lld/%lld: %zu prompt tokens, %lld answer tokens, %lld windows   ",
            (long long)k + 1, (long long)c->n_samples, n_ids, (long long)n, (long long)(c->n_win - w0));
    return 0;
}

/* The thresholds: quantiles of the windows, the heads' similarity; medians in med[2]. */
static void calib_thresholds(const calib *c, double quantile, unc_thresholds *t, double med[2], int *lo_i, int *hi_i,
                             double *tmp)
{
    *lo_i = *hi_i = -1;
    int n_kv = run_model(c->r)->hp.n_head_kv;
    for (int i = 0; i < c->n_hs && t->n_heads < UNC_MAX_HEADS; i++) {
        if (c->hcnt[i] == 0) continue;
        float sim = (float)(c->hsum[i] / (double)c->hcnt[i]);
        t->head_sim[t->n_heads++] = (unc_head_sim){ (int16_t)c->layers[i / n_kv], (int16_t)(i % n_kv), sim };
        if (*lo_i < 0 || sim < t->head_sim[*lo_i].sim) *lo_i = t->n_heads - 1;
        if (*hi_i < 0 || sim > t->head_sim[*hi_i].sim) *hi_i = t->n_heads - 1;
    }
    /* quantiles sort their input: take them on copies so each window keeps its pair for the plot */
    memcpy(tmp, c->mh, sizeof(double) * (size_t)c->n_win);
    t->h_mean = unc_quantile(tmp, c->n_win, quantile);
    med[0] = unc_quantile(tmp, c->n_win, 0.5);
    memcpy(tmp, c->vh, sizeof(double) * (size_t)c->n_win);
    t->h_var = unc_quantile(tmp, c->n_win, quantile);
    med[1] = unc_quantile(tmp, c->n_win, 0.5);
}

/* The thresholds also go to the session database, where kvchat looks first (by the model file's
 * sha256). 0, or 1 after printing. */
static int calib_store(const char *db_path, const char *mpath, const model *m, const unc_thresholds *t)
{
    store *db = cli_open_db(db_path);
    if (!db) return 1;
    store_persist sp;
    char sha[65], err[600] = "";
    store_persist_init(&sp, db);
    int rc = 0;
    if (sp.ops.model(&sp, mpath, m, sha, err, sizeof err) == 0 && store_thresholds_put(db, sp.model_id, t) == 0) {
        printf("  stored for model %.12s... in the session database\n", sha);
    } else {
        cli_err("calibrate: the thresholds file is written, the database was not updated: %s",
                err[0] ? err : store_error(db));
        rc = 1;
    }
    store_close(db);
    return rc;
}

/* Where the density plot goes: --plot PNG, else the thresholds file with .png; "" for --plot none. */
static void plot_path(const char *plot, const char *path, char *png, size_t cap)
{
    if (plot && !strcmp(plot, "none")) {
        png[0] = 0;
    } else if (plot) {
        snprintf(png, cap, "%s", plot);
    } else {
        snprintf(png, cap, "%s", path);
        char *dot = strrchr(png, '.'), *sl = strrchr(png, '/');
        if (dot && (!sl || dot > sl)) *dot = 0;
        strncat(png, ".png", cap - strlen(png) - 1);
    }
}

/* The density plot at png ("": none). 0, or 1 after printing. */
static int calib_plot(const char *png, const calib *c, const unc_thresholds *t)
{
    if (!png[0]) return 0;
    char err[1400], shown[1400];
    if (draw_plot(png, c->mh, c->vh, c->n_win, t, err, sizeof err)) {
        if (err[0])
            cli_err("calibrate: thresholds saved, but not the plot: %s", err);
        else
            cli_err("calibrate: thresholds saved, but the plot %s could not be drawn (needs gnuplot with pngcairo: "
                    "make bootstrap installs it)", png);
        return 1;
    }
    text_escape(png, shown, sizeof shown, 0);
    printf("  density plot: %s\n", shown);
    return 0;
}

/* The thresholds to path. unc_thresholds_save writes NAME.tmp, then renames it over NAME, and would
 * follow a link planted at path.tmp: it writes inside a new private directory beside path instead,
 * and the file is moved over path as every file kvchat writes (common/files.h). 0, or -1 with a
 * message. */
static int save_thresholds(const char *path, const unc_thresholds *t, char *err, size_t errlen)
{
    char dir[1300], file[1400];
    snprintf(dir, sizeof dir, "%s.XXXXXX", path);
    if (!mkdtemp(dir)) {
        snprintf(err, errlen, "%s: cannot create a file beside it: %s", path, strerror(errno));
        return -1;
    }
    snprintf(file, sizeof file, "%s/thresholds.txt", dir);
    int rc = unc_thresholds_save(file, t, err, errlen);
    if (rc == 0) rc = files_move_over(file, path, err, errlen);
    unlink(file);
    rmdir(dir);
    return rc;
}

static void calib_free(calib *c)
{
    free(c->hsum);
    free(c->hcnt);
    free(c->mh);
    free(c->vh);
    free(c->sim);
    free(c->layers);
    run_free(c->r);
}

/* The calibration set's sample k as a document (malloc'd) and its question. NULL after printing. */
static char *sample_doc(const calib_set *cs, const char *data, uint64_t seed, int64_t k, const char **question)
{
    size_t dlen;
    if (data) {
        *question = cs->questions[(k / cs->n_docs) % cs->n_questions];
        return cli_read_text_file(cs->docs[k % cs->n_docs], &dlen);
    }
    char *doc = docgen_calibration_sample(seed, (int)k, question, &dlen);
    if (!doc) cli_err("calibrate: out of memory");
    return doc;
}

int cmd_calibrate(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    o.sp.temperature = 0;
    o.sp.seed = 1;
    calib_opts co = { NULL, NULL, NULL, 24, 96, 0.99f };
    opt_group grp[] = { { calib_defs, &co, NULL }, CLI_MODEL(&o), CLI_POLICY(&o), CLI_GREEDY_SAMPLING(&o), CLI_STORE(&o) };
    int r = cli_parse(argc, argv, "kvchat calibrate [-m MODEL] [options]",
                      "Runs the model with the full cache over a calibration set, collects the (mean entropy, entropy\n"
                      "variance) of every window of P answer tokens, and stores their 99th percentiles as the thresholds\n"
                      "the uncertainty monitor uses for this model (kvchat ask finds them by the model's fingerprint).",
                      grp, 5, NULL, 0, NULL);
    if (r) return r > 0 ? 0 : 1;
    if (o.policy || o.budget) {
        cli_err("calibrate: the thresholds are taken with the full cache; --policy and --budget do not apply");
        return 1;
    }
    if (cli_finish_common(&o)) return 1;
    calib_set cs = { 0 };
    if (co.data && load_data_dir(co.data, &cs)) {
        set_free(&cs);
        return 1;
    }
    calib c;
    memset(&c, 0, sizeof c);
    char err[1600], fp[17], model_path[1024];
    const char *mpath = o.model_path ? o.model_path : cli_default_model_path(model_path, sizeof model_path);
    int rc = 1;
    o.no_calibration = 1;
    if (!(c.r = cli_run(&o))) goto done;
    run_set_abort(c.r, &cli_interrupted);
    c.m = run_model(c.r);
    c.n_predict = co.n_predict;
    int n_layer = c.m->hp.n_layer, n_hs = n_layer * c.m->hp.n_head_kv;
    c.sim = malloc(sizeof(double) * (size_t)(n_hs > 0 ? n_hs : 1));
    c.layers = malloc(sizeof(int) * (size_t)(n_layer > 0 ? n_layer : 1));
    c.hsum = calloc((size_t)(n_hs > 0 ? n_hs : 1), sizeof(double));
    c.hcnt = calloc((size_t)(n_hs > 0 ? n_hs : 1), sizeof(int64_t));
    if (!c.sim || !c.layers || !c.hsum || !c.hcnt) {
        cli_err("calibrate: out of memory");
        goto done;
    }
    c.n_hs = run_head_similarity(c.r, c.sim, c.layers, n_hs);
    if (model_fingerprint(mpath, fp, err, sizeof err)) {
        cli_err("calibrate: %s", err);
        goto done;
    }
    int64_t n_samples = co.n_samples;
    if (co.data && n_samples > (int64_t)cs.n_docs * cs.n_questions) n_samples = (int64_t)cs.n_docs * cs.n_questions;
    c.n_samples = n_samples;
    /* where the results go, checked before the minutes of calibration: a directory, FIFO or device
     * there is refused now rather than after */
    char path[1200], png[1300];
    if (co.out)
        snprintf(path, sizeof path, "%s", co.out);
    else if (cli_thresholds_path(fp, path, sizeof path, 1)) {
        cli_err("calibrate: no data directory (set HOME or XDG_DATA_HOME, or give --out FILE)");
        goto done;
    }
    plot_path(co.plot, path, png, sizeof png);
    if (files_replaceable(path, err, sizeof err) || (png[0] && files_replaceable(png, err, sizeof err))) {
        cli_err("calibrate: %s", err);
        goto done;
    }
    cli_catch_stop_signals();
    double t0 = cli_now();
    for (int64_t k = 0; k < n_samples; k++) {
        const char *question;
        char *doc = sample_doc(&cs, co.data, o.sp.seed, k, &question);
        if (!doc || (rc = calib_sample(&c, k, doc, question)) != 0) goto done;
        rc = 1;
    }
    fputc('\n', stderr);
    const int P = unc_page_size(run_monitor(c.r));
    if (c.n_win < 10) {
        cli_err("calibrate: only %lld windows of %d answer tokens were seen; use more samples or a larger -n",
                (long long)c.n_win, P);
        goto done;
    }
    unc_thresholds t = { 0 };
    t.valid = 1;
    t.page = P;
    t.quantile = co.quantile;
    t.samples = c.n_win;
    t.seed = o.sp.seed;
    const char *base = strrchr(mpath, '/');
    snprintf(t.model, sizeof t.model, "%s", base ? base + 1 : mpath);
    snprintf(t.fingerprint, sizeof t.fingerprint, "%s", fp);
    double med[2], *tmp = malloc(sizeof(double) * (size_t)c.n_win);
    int lo_i, hi_i;
    if (!tmp) {
        cli_err("calibrate: out of memory");
        goto done;
    }
    calib_thresholds(&c, co.quantile, &t, med, &lo_i, &hi_i, tmp);
    free(tmp);
    int64_t over = 0;
    for (int64_t i = 0; i < c.n_win; i++) over += c.mh[i] > t.h_mean || c.vh[i] > t.h_var;
    if (save_thresholds(path, &t, err, sizeof err)) {
        cli_err("calibrate: %s", err);
        goto done;
    }
    double q = co.quantile;
    printf("calibrated %s (fingerprint %s) in %.0f s: %lld samples, %lld answer tokens, %lld windows of %d tokens\n",
           t.model, fp, cli_now() - t0, (long long)n_samples, (long long)c.tokens_gen, (long long)c.n_win, P);
    printf("  mean entropy:     median %.3f, q%.0f %.3f  -> threshold %.4f\n", med[0], q * 100, t.h_mean, t.h_mean);
    printf("  entropy variance: median %.3f, q%.0f %.3f  -> threshold %.4f\n", med[1], q * 100, t.h_var, t.h_var);
    printf("  %lld of %lld windows (%.1f%%) cross either threshold\n", (long long)over, (long long)c.n_win,
           100.0 * (double)over / (double)c.n_win);
    if (lo_i >= 0)
        printf("  key similarity of %d global KV heads (Chelsea): least %.3f (layer %d head %d), most %.3f (layer %d "
               "head %d); Chelsea's default 4%% spares the %d least similar\n",
               t.n_heads, t.head_sim[lo_i].sim, t.head_sim[lo_i].layer, t.head_sim[lo_i].head, t.head_sim[hi_i].sim,
               t.head_sim[hi_i].layer, t.head_sim[hi_i].head, (int)(0.04 * t.n_heads + 0.5));
    char shown[1400];
    text_escape(path, shown, sizeof shown, 0);
    printf("  thresholds: %s\n", shown);
    rc = calib_store(o.db, mpath, c.m, &t);
    rc |= calib_plot(png, &c, &t);
done:
    calib_free(&c);
    set_free(&cs);
    return rc;
}
