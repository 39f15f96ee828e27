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
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/policy/chelsea.h"
#include "app/cli.h"
#include "app/commands.h"
#include "app/docgen.h"
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

static int draw_plot(const char *png, const double *mh, const double *vh, int64_t n, const unc_thresholds *t)
{
    double xmax = t->h_mean * 1.5, ymax = t->h_var * 1.5;
    for (int64_t i = 0; i < n; i++) {
        if (mh[i] * 1.05 > xmax) xmax = mh[i] * 1.05;
        if (vh[i] * 1.05 > ymax) ymax = vh[i] * 1.05;
    }
    if (xmax <= 0) xmax = 1;
    if (ymax <= 0) ymax = 1;
    char dat[] = "/tmp/kvchat-calib-XXXXXX";
    int fd = mkstemp(dat);
    if (fd < 0) return -1;
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        unlink(dat);
        return -1;
    }
    write_plot_data(f, mh, vh, n, xmax, ymax);
    fclose(f);
    FILE *gp = popen("gnuplot 2>&1", "w");
    if (!gp) {
        unlink(dat);
        return -1;
    }
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
            "plot '%s' using 1:2:($3 > 0 ? $3 : 1/0) with image notitle\n",
            png, t->model, (long long)n, t->page, xmax, ymax, t->h_mean, t->h_mean, ymax, t->h_var, xmax, t->h_var,
            t->quantile * 100, t->h_mean, t->h_var, dat);
    int st = pclose(gp);
    unlink(dat);
    return st == 0 && access(png, R_OK) == 0 ? 0 : -1;
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

int cmd_calibrate(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    o.sp.temperature = 0;
    o.sp.seed = 1;
    calib_opts co = { NULL, NULL, NULL, 24, 96, 0.99f };
    opt_group grp[] = { { calib_defs, &co, NULL }, CLI_MODEL(&o), CLI_POLICY(&o), CLI_SAMPLING(&o), CLI_STORE(&o) };
    int r = cli_parse(argc, argv, "kvchat calibrate [-m MODEL] [options]",
                      "Runs the model with the full cache over a calibration set, collects the (mean entropy, entropy\n"
                      "variance) of every window of P answer tokens, and stores their 99th percentiles as the thresholds\n"
                      "the uncertainty monitor uses for this model (kvchat ask finds them by the model's fingerprint).",
                      grp, 5, NULL, 0, NULL);
    if (r) return r > 0 ? 0 : 1;
    const char *data = co.data, *out = co.out, *plot = co.plot;
    int64_t n_samples = co.n_samples, n_predict = co.n_predict;
    double quantile = co.quantile;
    if (o.policy || o.budget) {
        cli_err("calibrate: the thresholds are taken with the full cache; --policy and --budget do not apply");
        return 1;
    }
    if (cli_finish_common(&o)) return 1;
    calib_set cs = { 0 };
    if (data && load_data_dir(data, &cs)) {
        set_free(&cs);
        return 1;
    }
    /* the windows are the KV page size asked for here, not that of thresholds found earlier */
    session *S = cli_session(&o, n_predict, SESS_FORMAT_AUTO);
    if (!S) {
        set_free(&cs);
        return 1;
    }
    struct {
        const model *m;
        fwd_ctx *f;
        unc_monitor *mon;
    } rt = { sess_model(S), sess_fwd_mut(S), unc_create(kv_page_size(fwd_kv(sess_fwd(S))), 0) };
    int rc = 1;
    char err[600], fp[17], model_path[1024];
    const char *mpath = o.model_path ? o.model_path : cli_default_model_path(model_path, sizeof model_path);
    int32_t nv = rt.m->hp.n_vocab;
    float *logits = malloc(sizeof(float) * (size_t)nv);
    samp *s = samp_create(&o.sp, nv);
    double *mh = NULL, *vh = NULL, *hsum = NULL;
    int64_t *hcnt = NULL;
    int64_t n_win = 0, cap = 0;
    int32_t *ids = NULL;
    if (!logits || !s || !rt.mon) {
        cli_err("calibrate: out of memory");
        goto done;
    }
    if (model_fingerprint(mpath, fp, err, sizeof err)) {
        cli_err("calibrate: %s", err);
        goto done;
    }
    if (data) n_samples = n_samples < (int64_t)cs.n_docs * cs.n_questions ? n_samples : (int64_t)cs.n_docs * cs.n_questions;
    const int P = unc_page_size(rt.mon);
    unc_thresholds none = { 0 };
    cli_install_sigint();
    double t0 = cli_now();
    int64_t tokens_gen = 0;
    pol_env env;
    fwd_policy_env(rt.f, &env);
    int n_hs = env.n_global * env.n_head_kv;
    hsum = calloc((size_t)(n_hs > 0 ? n_hs : 1), sizeof(double));
    hcnt = calloc((size_t)(n_hs > 0 ? n_hs : 1), sizeof(int64_t));
    if (!hsum || !hcnt) {
        cli_err("calibrate: out of memory");
        goto done;
    }
    for (int64_t k = 0; k < n_samples; k++) {
        const char *question;
        size_t dlen;
        char *doc;
        if (data) {
            doc = cli_read_text_file(cs.docs[k % cs.n_docs], &dlen);
            question = cs.questions[(k / cs.n_docs) % cs.n_questions];
            if (!doc) goto done;
        } else {
            doc = docgen_calibration_sample(o.sp.seed, (int)k, &question, &dlen);
            if (!doc) {
                cli_err("calibrate: out of memory");
                goto done;
            }
        }
        size_t n_ids = 0;
        free(ids);
        ids = NULL;
        int bad = prompt_conversation(rt.m, prompt_has_template(rt.m), doc, NULL, 0, question, &ids, &n_ids, err,
                                      sizeof err);
        free(doc);
        if (bad) {
            cli_err("calibrate: sample %lld: %s", (long long)k + 1, err);
            goto done;
        }
        if ((int64_t)n_ids + n_predict > fwd_n_ctx(rt.f)) {
            cli_err("calibrate: sample %lld is %zu tokens, too long for the context of %lld with %lld answer tokens",
                    (long long)k + 1, n_ids, (long long)fwd_n_ctx(rt.f), (long long)n_predict);
            goto done;
        }
        fwd_rewind(rt.f, 0);
        samp_reset(s);
        for (size_t i = 0; i < n_ids; i++) samp_accept(s, ids[i]);
        if (fwd_eval(rt.f, ids, (int64_t)n_ids, logits, NULL, NULL, NULL, NULL, &cli_interrupted, err, sizeof err)) {
            cli_err("calibrate: %s", cli_interrupted ? "interrupted" : err);
            if (cli_interrupted) rc = 130;
            goto done;
        }
        /* Chelsea's outlier heads: how similar each global KV head's prompt keys are (chunks of 256) */
        for (int gi = 0; gi < env.n_global; gi++)
            for (int g = 0; g < env.n_head_kv; g++) {
                double sim;
                if (chelsea_head_similarity(fwd_kv(rt.f), env.global[gi], g, 256, &sim) == 0) {
                    hsum[gi * env.n_head_kv + g] += sim;
                    hcnt[gi * env.n_head_kv + g]++;
                }
            }
        gen_opts go = { n_predict, ids[n_ids - 1], &none, 0, samp_temperature(s), 1 };
        gen_result gr;
        if (gen_answer(rt.f, s, rt.m->vocab, rt.mon, logits, nv, &go, NULL, &cli_interrupted, &gr, err, sizeof err)) {
            cli_err("calibrate: %s", err);
            goto done;
        }
        if (gr.stop == GEN_STOP_INTERRUPT) {
            cli_err("calibrate: interrupted; nothing written");
            rc = 130;
            goto done;
        }
        int64_t n = unc_count(rt.mon), w0 = n_win;
        for (int64_t t = P; t <= n; t++) {
            if (n_win == cap) {
                int64_t nc = cap ? cap * 2 : 1024;
                double *a = realloc(mh, sizeof(double) * (size_t)nc), *b = a ? realloc(vh, sizeof(double) * (size_t)nc) : NULL;
                if (a) mh = a;
                if (!a || !b) {
                    cli_err("calibrate: out of memory");
                    goto done;
                }
                vh = b;
                cap = nc;
            }
            unc_stats st;
            unc_range(rt.mon, t - P, P, &st);
            mh[n_win] = st.mean_h;
            vh[n_win] = st.var_h;
            n_win++;
        }
        tokens_gen += n;
        fprintf(stderr, "\rcalibrate: sample %lld/%lld: %zu prompt tokens, %lld answer tokens, %lld windows   ",
                (long long)k + 1, (long long)n_samples, n_ids, (long long)n, (long long)(n_win - w0));
    }
    fputc('\n', stderr);
    if (n_win < 10) {
        cli_err("calibrate: only %lld windows of %d answer tokens were seen; use more samples or a larger -n",
                (long long)n_win, P);
        goto done;
    }
    unc_thresholds t = { 0 };
    t.valid = 1;
    t.page = P;
    t.quantile = quantile;
    t.samples = n_win;
    t.seed = o.sp.seed;
    const char *base = strrchr(mpath, '/');
    snprintf(t.model, sizeof t.model, "%s", base ? base + 1 : mpath);
    snprintf(t.fingerprint, sizeof t.fingerprint, "%s", fp);
    int lo_i = -1, hi_i = -1;
    for (int i = 0; i < n_hs && t.n_heads < UNC_MAX_HEADS; i++) {
        if (hcnt[i] == 0) continue;
        float sim = (float)(hsum[i] / (double)hcnt[i]);
        t.head_sim[t.n_heads++] = (unc_head_sim){ (int16_t)env.global[i / env.n_head_kv], (int16_t)(i % env.n_head_kv), sim };
        if (lo_i < 0 || sim < t.head_sim[lo_i].sim) lo_i = t.n_heads - 1;
        if (hi_i < 0 || sim > t.head_sim[hi_i].sim) hi_i = t.n_heads - 1;
    }
    /* quantiles sort their input: take them on copies so each window keeps its pair for the plot */
    double *tmp = malloc(sizeof(double) * (size_t)n_win);
    if (!tmp) {
        cli_err("calibrate: out of memory");
        goto done;
    }
    double med[2];
    memcpy(tmp, mh, sizeof(double) * (size_t)n_win);
    t.h_mean = unc_quantile(tmp, n_win, quantile);
    med[0] = unc_quantile(tmp, n_win, 0.5);
    memcpy(tmp, vh, sizeof(double) * (size_t)n_win);
    t.h_var = unc_quantile(tmp, n_win, quantile);
    med[1] = unc_quantile(tmp, n_win, 0.5);
    free(tmp);
    int64_t over = 0;
    for (int64_t i = 0; i < n_win; i++) over += mh[i] > t.h_mean || vh[i] > t.h_var;
    char path[1200];
    if (out)
        snprintf(path, sizeof path, "%s", out);
    else if (cli_thresholds_path(fp, path, sizeof path, 1)) {
        cli_err("calibrate: no data directory (set HOME or XDG_DATA_HOME, or give --out FILE)");
        goto done;
    }
    if (unc_thresholds_save(path, &t, err, sizeof err)) {
        cli_err("calibrate: %s", err);
        goto done;
    }
    printf("calibrated %s (fingerprint %s) in %.0f s: %lld samples, %lld answer tokens, %lld windows of %d tokens\n",
           t.model, fp, cli_now() - t0, (long long)n_samples, (long long)tokens_gen, (long long)n_win, P);
    printf("  mean entropy:     median %.3f, q%.0f %.3f  -> threshold %.4f\n", med[0], quantile * 100, t.h_mean,
           t.h_mean);
    printf("  entropy variance: median %.3f, q%.0f %.3f  -> threshold %.4f\n", med[1], quantile * 100, t.h_var,
           t.h_var);
    printf("  %lld of %lld windows (%.1f%%) cross either threshold\n", (long long)over, (long long)n_win,
           100.0 * (double)over / (double)n_win);
    if (lo_i >= 0)
        printf("  key similarity of %d global KV heads (Chelsea): least %.3f (layer %d head %d), most %.3f (layer %d "
               "head %d); Chelsea's default 4%% spares the %d least similar\n",
               t.n_heads, t.head_sim[lo_i].sim, t.head_sim[lo_i].layer, t.head_sim[lo_i].head, t.head_sim[hi_i].sim,
               t.head_sim[hi_i].layer, t.head_sim[hi_i].head, (int)(0.04 * t.n_heads + 0.5));
    printf("  thresholds: %s\n", path);
    /* and in the session database, where kvchat looks first (by the model file's sha256) */
    store *db = cli_open_db(o.db);
    store_persist sp;
    char sha[65];
    if (db) store_persist_init(&sp, db);
    if (db && sp.ops.model(&sp, mpath, rt.m, sha, err, sizeof err) == 0 && store_thresholds_put(db, sp.model_id, &t) == 0)
        printf("  stored for model %.12s... in the session database\n", sha);
    else if (db)
        cli_err("calibrate: the thresholds file is written, the database was not updated: %s",
                store_error(db)[0] ? store_error(db) : err);
    store_close(db);
    rc = db ? 0 : 1;
    if (!plot || strcmp(plot, "none")) {
        char png[1300];
        if (plot) {
            snprintf(png, sizeof png, "%s", plot);
        } else {
            snprintf(png, sizeof png, "%s", path);
            char *dot = strrchr(png, '.'), *sl = strrchr(png, '/');
            if (dot && (!sl || dot > sl)) *dot = 0;
            strncat(png, ".png", sizeof png - strlen(png) - 1);
        }
        if (draw_plot(png, mh, vh, n_win, &t)) {
            cli_err("calibrate: thresholds saved, but the plot %s could not be drawn (needs gnuplot with pngcairo: "
                    "make bootstrap installs it)", png);
            rc = 1;
        } else {
            printf("  density plot: %s\n", png);
        }
    }
done:
    free(hsum);
    free(hcnt);
    free(ids);
    free(mh);
    free(vh);
    free(logits);
    samp_free(s);
    unc_free(rt.mon);
    sess_free(S);
    set_free(&cs);
    return rc;
}
