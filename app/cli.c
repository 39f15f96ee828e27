/* cli.c - helpers shared by the subcommands (see cli.h). */
#include "app/cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/chat.h"
#include "common/quant.h"
#include "store/store.h"
#include "engine/tokenizer.h"
#include "kernels/cpu/vec_dot.h"

volatile sig_atomic_t cli_interrupted = 0;

static void on_sigint(int sig)
{
    (void)sig;
    /* A second Ctrl-C while the first is being honoured exits at once. */
    if (cli_interrupted) _exit(130);
    cli_interrupted = 1;
}

void cli_install_sigint(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

/* Where this thread's errors go instead of stderr (the terminal interface owns the screen). */
static _Thread_local char *err_sink;
static _Thread_local size_t err_sink_cap;

void cli_err_to(char *buf, size_t cap)
{
    err_sink = buf;
    err_sink_cap = cap;
    if (buf && cap) buf[0] = 0;
}

void cli_err(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err_sink && err_sink_cap) {
        vsnprintf(err_sink, err_sink_cap, fmt, ap);
        va_end(ap);
        return;
    }
    fputs("kvchat: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

void cli_opts_init(cli_opts *o)
{
    memset(o, 0, sizeof *o);
    o->sp = samp_params_default();
    o->backtrack = -1;
}

const char *cli_need_value(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        cli_err("option %s needs a value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int cli_parse_int(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        cli_err("%s: '%s' is not an integer in [%lld, %lld]", opt, s, (long long)lo, (long long)hi);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_float(const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        cli_err("%s: '%s' is not a number in [%g, %g]", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_finish_common(cli_opts *o)
{
    char err[512];
    if (o->policy && !strcmp(o->policy, "help")) {
        cli_policy_help();
        exit(0);
    }
    if (pol_parse(&o->pspec, o->policy, o->budget, err, sizeof err)) {
        cli_err("%s", err);
        return -1;
    }
    return 0;
}

void cli_policy_help(void)
{
    char buf[8192];
    pol_list(buf, sizeof buf);
    printf("KV-cache policies (--policy NAME[:k=v,...][+NAME...], --budget B):\n%s", buf);
}

int cli_parse_common(cli_opts *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    const char *v;
    int64_t iv;
    double dv;
#define VAL() do { if (!(v = cli_need_value(argc, argv, i))) return -1; } while (0)
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
        VAL();
        o->model_path = v;
    } else if (!strcmp(a, "--tokenizer")) {
        VAL();
        o->tokenizer_path = v;
    } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
        VAL();
        if (cli_parse_int(a, v, 1, 256, &iv)) return -1;
        o->n_threads = (int)iv;
    } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) {
        VAL();
        if (cli_parse_int(a, v, 16, 1 << 22, &iv)) return -1;
        o->n_ctx = iv;
    } else if (!strcmp(a, "--batch")) {
        VAL();
        if (cli_parse_int(a, v, 1, 8192, &iv)) return -1;
        o->n_batch = (int)iv;
    } else if (!strcmp(a, "--no-simd")) {
        o->no_simd = 1;
    } else if (!strcmp(a, "--device")) {
        VAL();
        if (!strcmp(v, "cpu")) {
            o->device = CLI_DEV_CPU;
        } else if (!strcmp(v, "cuda")) {
            o->device = CLI_DEV_CUDA;
        } else {
            cli_err("--device is cpu or cuda, not '%s'", v);
            return -1;
        }
    } else if (!strcmp(a, "--policy")) {
        VAL();
        o->policy = v;
    } else if (!strcmp(a, "--budget")) {
        VAL();
        o->budget = v;
    } else if (!strcmp(a, "--page-size")) {
        VAL();
        if (cli_parse_int(a, v, 1, 4096, &iv)) return -1;
        o->page_size = (int)iv;
    } else if (!strcmp(a, "--backtrack")) {
        VAL();
        if (cli_parse_int(a, v, 0, 1 << 20, &iv)) return -1;
        o->backtrack = (int)iv;
    } else if (!strcmp(a, "--thresholds")) {
        VAL();
        o->thresholds = v;
    } else if (!strcmp(a, "--show-events")) {
        o->show_events = 1;
    } else if (!strcmp(a, "--db")) {
        VAL();
        o->db = v;
    } else if (!strcmp(a, "--no-db")) {
        o->no_db = 1;
    } else if (!strcmp(a, "--temp")) {
        VAL();
        if (cli_parse_float(a, v, 0, 100, &dv)) return -1;
        o->sp.temperature = (float)dv;
    } else if (!strcmp(a, "--top-k")) {
        VAL();
        if (cli_parse_int(a, v, 0, INT32_MAX, &iv)) return -1;
        o->sp.top_k = (int32_t)iv;
    } else if (!strcmp(a, "--top-p")) {
        VAL();
        if (cli_parse_float(a, v, 0, 1, &dv)) return -1;
        o->sp.top_p = (float)dv;
    } else if (!strcmp(a, "--min-p")) {
        VAL();
        if (cli_parse_float(a, v, 0, 1, &dv)) return -1;
        o->sp.min_p = (float)dv;
    } else if (!strcmp(a, "--repeat-penalty")) {
        VAL();
        if (cli_parse_float(a, v, 0.01, 100, &dv)) return -1;
        o->sp.repeat_penalty = (float)dv;
    } else if (!strcmp(a, "--repeat-last-n")) {
        VAL();
        if (cli_parse_int(a, v, 0, 4096, &iv)) return -1;
        o->sp.repeat_last_n = (int32_t)iv;
    } else if (!strcmp(a, "--seed")) {
        VAL();
        if (cli_parse_int(a, v, 0, INT64_MAX, &iv)) return -1;
        o->sp.seed = (uint64_t)iv;
    } else {
        return 0;
    }
#undef VAL
    return 1;
}

const char *cli_default_model_path(char *buf, size_t cap)
{
    const char *env = getenv("KVCHAT_MODEL");
    if (env && *env) {
        snprintf(buf, cap, "%s", env);
        return buf;
    }
    const char *cache = getenv("KVCHAT_CACHE");
    if (cache && *cache) {
        snprintf(buf, cap, "%s/models/gemma-3-270m-q4_k_m.gguf", cache);
        return buf;
    }
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    if (xdg && *xdg)
        snprintf(buf, cap, "%s/kvchat/models/gemma-3-270m-q4_k_m.gguf", xdg);
    else
        snprintf(buf, cap, "%s/.cache/kvchat/models/gemma-3-270m-q4_k_m.gguf", home ? home : ".");
    return buf;
}

/* A policy set for spec on rt's forward context, replacing the old one. 0, or -1 after printing. */
static int attach_policy(cli_runtime *rt, const pol_spec *spec)
{
    char err[600];
    pol_env env;
    fwd_policy_env(rt->f, &env);
    pol_set *ps = pol_set_create(spec, &env, err, sizeof err);
    if (!ps) {
        cli_err("%s", err);
        return -1;
    }
    fwd_set_policy(rt->f, ps);
    pol_set_free(rt->ps);
    rt->ps = ps;
    return 0;
}

int cli_reopen_fwd(cli_runtime *rt, const cli_opts *o, int page_size)
{
    char err[600];
    fwd_opts fo = { o->n_ctx, o->n_batch, page_size };
    if (fo.n_ctx <= 0) fo.n_ctx = rt->m->hp.n_ctx_train;
    fwd_ctx *f = fwd_create(rt->m, rt->b, &fo, err, sizeof err);
    if (!f) {
        cli_err("%s", err);
        return -1;
    }
    pol_spec spec = *pol_set_spec(rt->ps);
    fwd_free(rt->f);
    rt->f = f;
    if (cli_apply_head_similarity(rt)) {
        cli_err("out of memory");
        return -1;
    }
    return attach_policy(rt, &spec);
}

int cli_set_policy(cli_runtime *rt, const char *spec_text, const char *budget)
{
    char err[600];
    pol_spec spec;
    if (pol_parse(&spec, spec_text, budget && *budget ? budget : NULL, err, sizeof err)) {
        cli_err("%s", err);
        return -1;
    }
    return attach_policy(rt, &spec);
}

int cli_apply_head_similarity(cli_runtime *rt)
{
    if (!rt->thr.valid || rt->thr.n_heads == 0) return fwd_set_head_similarity(rt->f, NULL);
    int nl = rt->m->hp.n_layer, nh = rt->m->hp.n_head_kv;
    float *sim = malloc(sizeof(float) * (size_t)nl * (size_t)nh);
    if (!sim) return -1;
    for (int i = 0; i < nl * nh; i++) sim[i] = NAN;
    for (int i = 0; i < rt->thr.n_heads; i++) {
        const unc_head_sim *e = &rt->thr.head_sim[i];
        if (e->layer < nl && e->head < nh) sim[e->layer * nh + e->head] = e->sim;
    }
    int rc = fwd_set_head_similarity(rt->f, sim);
    free(sim);
    return rc;
}

/* A device backend copies every weight it will multiply now, so a model too large for the device is
 * a clear error before anything runs. */
static int cli_prepare_weights(cli_runtime *rt, char *err, size_t errlen)
{
    if (!rt->b->ops->prepare) return 0;
    const model *m = rt->m;
    int n = 0;
    const be_weight **w = malloc(sizeof *w * (size_t)(m->hp.n_layer * 7 + 1));
    if (!w) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int il = 0; il < m->hp.n_layer; il++) {
        const model_layer *L = &m->layers[il];
        const be_weight *lw[] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down };
        for (int i = 0; i < 7; i++) w[n++] = lw[i];
    }
    w[n++] = &m->output;
    int rc = rt->b->ops->prepare(rt->b, w, n, err, errlen);
    free(w);
    return rc;
}

int cli_open(cli_runtime *rt, const cli_opts *o, int with_fwd)
{
    char err[600], pathbuf[1024];
    memset(rt, 0, sizeof *rt);
    const char *path = o->model_path;
    if (!path) {
        path = cli_default_model_path(pathbuf, sizeof pathbuf);
        struct stat st;
        if (stat(path, &st) != 0) {
            cli_err("default model not found at %s (run `make model`, or pass -m MODEL.gguf)", path);
            return -1;
        }
    }
    if (o->no_simd) vd_force_scalar(1);
    model_load_opts lo = { o->tokenizer_path };
    if (model_load(&rt->m, path, &lo, err, sizeof err) != 0) {
        cli_err("%s", err);
        return -1;
    }
    /* CUDA when asked for, or by default when a device is present */
    int cuda = o->device == CLI_DEV_CUDA || (o->device == CLI_DEV_AUTO && be_cuda_devices() > 0);
    rt->b = cuda ? be_cuda_create(o->n_threads, err, sizeof err) : be_cpu_create(o->n_threads, err, sizeof err);
    if (!rt->b || cli_prepare_weights(rt, err, sizeof err)) {
        cli_err("%s", err);
        cli_close(rt);
        return -1;
    }
    if (with_fwd) {
        fwd_opts fo = { o->n_ctx, o->n_batch, o->page_size };
        if (fo.n_ctx <= 0) fo.n_ctx = rt->m->hp.n_ctx_train;   /* pages are allocated as tokens arrive */
        rt->f = fwd_create(rt->m, rt->b, &fo, err, sizeof err);
        if (!rt->f) {
            cli_err("%s", err);
            cli_close(rt);
            return -1;
        }
        if (cli_find_thresholds(path, o->thresholds, o->db, &rt->thr)) {
            cli_close(rt);
            return -1;
        }
        if (cli_apply_head_similarity(rt)) {
            cli_err("out of memory");
            cli_close(rt);
            return -1;
        }
        pol_spec spec = o->pspec;
        if (spec.n == 0 && pol_parse(&spec, o->policy, o->budget, err, sizeof err)) {
            cli_err("%s", err);
            cli_close(rt);
            return -1;
        }
        if (attach_policy(rt, &spec)) {
            cli_close(rt);
            return -1;
        }
        /* calibrated thresholds hold for windows of the size they were measured on */
        int up = rt->thr.valid && rt->thr.page > 0 ? rt->thr.page : kv_page_size(fwd_kv(rt->f));
        rt->mon = unc_create(up, 0);
        if (!rt->mon) {
            cli_err("out of memory");
            cli_close(rt);
            return -1;
        }
        rt->backtrack = o->backtrack >= 0 ? o->backtrack : pol_set_can_reselect(rt->ps) ? 2 : 0;
    }
    return 0;
}

void cli_close(cli_runtime *rt)
{
    fwd_free(rt->f);
    pol_set_free(rt->ps);
    unc_free(rt->mon);
    be_free(rt->b);
    model_free(rt->m);
    memset(rt, 0, sizeof *rt);
}

int cli_doc_prompt(const cli_runtime *rt, const char *doc, const char *question, int format, int32_t **ids,
                   size_t *n_ids, char *err, size_t errlen)
{
    size_t len = strlen(doc) + strlen(question) + 32;
    char *text = malloc(len);
    if (!text) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (format < 0) format = gguf_find_key(rt->m->gguf, "tokenizer.chat_template") >= 0;
    int rc;
    if (format) {
        snprintf(text, len, "%s\n\n%s", doc, question);
        chat_msg msg = { "user", text };
        char *rendered = chat_render(chat_family_for(rt->m->gguf), &msg, 1, 1, err, errlen);
        rc = !rendered || tok_encode(rt->m->vocab, rendered, strlen(rendered), 0, 1, ids, n_ids, err, errlen) ? -1 : 0;
        free(rendered);
    } else {
        snprintf(text, len, "%s\n\nQuestion: %s\nAnswer:", doc, question);
        rc = tok_encode(rt->m->vocab, text, strlen(text), tok_add_bos(rt->m->vocab), 0, ids, n_ids, err, errlen) ? -1 : 0;
    }
    free(text);
    if (rc == 0 && *n_ids == 0) {
        snprintf(err, errlen, "the prompt is empty");
        rc = -1;
    }
    return rc;
}

int cli_split_policies(const char *list, char specs[][256], int max)
{
    int n = 0;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", list);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int cont = strchr(t, '=') && !strchr(t, ':') && n > 0;
        if (cont) {
            size_t l = strlen(specs[n - 1]);
            snprintf(specs[n - 1] + l, 256 - l, ",%s", t);
        } else {
            if (n == max) return -1;
            snprintf(specs[n++], 256, "%s", t);
        }
    }
    return n;
}

char *cli_load_text(const char *path, size_t *len, char *err, size_t errlen)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(fp), &st) != 0 || S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "%s: is a directory", path);
        fclose(fp);
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf) {
            snprintf(err, errlen, "%s: out of memory", path);
            fclose(fp);
            return NULL;
        }
        size_t got = fread(buf + n, 1, cap - n, fp);
        n += got;
        if (got == 0) break;
        if (n == cap) {
            cap *= 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    int rerr = ferror(fp);
    fclose(fp);
    if (rerr) {
        snprintf(err, errlen, "%s: read error", path);
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    if (memchr(buf, 0, n)) {
        snprintf(err, errlen, "%s: binary file (contains NUL bytes at byte %zu), expected text", path,
                (size_t)((char *)memchr(buf, 0, n) - buf));
        free(buf);
        return NULL;
    }
    int64_t bad = tok_utf8_invalid_at(buf, n);
    if (bad >= 0) {
        snprintf(err, errlen, "%s: invalid UTF-8 at byte %lld", path, (long long)bad);
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

char *cli_read_text_file(const char *path, size_t *len)
{
    char err[1200];
    char *t = cli_load_text(path, len, err, sizeof err);
    if (!t) cli_err("%s", err);
    return t;
}

void cli_read_cmd(const char *cmd, char *buf, size_t cap)
{
    buf[0] = 0;
    FILE *p = popen(cmd, "r");
    if (!p) return;
    if (fgets(buf, (int)cap, p)) buf[strcspn(buf, "\n")] = 0;
    pclose(p);
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double cli_peak_rss_mib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
}

typedef struct stream_ud {
    tok_stream ts;
    int show_events;
    cli_answer *out;
} stream_ud;

void cli_answer_free(cli_answer *a)
{
    if (!a) return;
    free(a->ids);
    free(a->text);
    memset(a, 0, sizeof *a);
}

static void answer_text(cli_answer *a, const char *p, size_t w)
{
    if (!a || a->oom) return;
    if (a->len + w + 1 > a->text_cap) {
        size_t nc = (a->len + w + 1) * 2;
        char *nt = realloc(a->text, nc);
        if (!nt) {
            a->oom = 1;
            return;
        }
        a->text = nt;
        a->text_cap = nc;
    }
    memcpy(a->text + a->len, p, w);
    a->len += w;
    a->text[a->len] = 0;
}

static void on_token(void *ud, int32_t id)
{
    stream_ud *u = ud;
    char piece[512];
    size_t w = tok_stream_feed(&u->ts, id, piece, sizeof piece);
    if (w) {
        fwrite(piece, 1, w, stdout);
        fflush(stdout);
    }
    cli_answer *a = u->out;
    if (!a || a->oom) return;
    if (a->n == a->cap) {
        int64_t nc = a->cap ? a->cap * 2 : 256;
        int32_t *ni = realloc(a->ids, sizeof(int32_t) * (size_t)nc);
        if (!ni) {
            a->oom = 1;
            return;
        }
        a->ids = ni;
        a->cap = nc;
    }
    a->ids[a->n++] = id;
    answer_text(a, piece, w);
}

static void on_page(void *ud, int64_t page, const unc_stats *st)
{
    stream_ud *u = ud;
    if (u->show_events)
        fprintf(stderr, "uncertainty: answer page %lld: mean H %.3f, Var(H) %.3f\n", (long long)page, st->mean_h,
                st->var_h);
}

static void on_event(void *ud, const unc_event *e)
{
    stream_ud *u = ud;
    if (!u->show_events) return;
    char line[1024];
    unc_event_format(e, line, sizeof line);
    fprintf(stderr, "uncertainty: %s\n", line);
}

int cli_stream_answer(cli_runtime *rt, samp *s, float *logits, int32_t prev_token, int64_t n_predict,
                      int show_events, gen_result *res, const char **stop_note, cli_answer *out, char *err,
                      size_t errlen)
{
    stream_ud u;
    tok_stream_init(&u.ts, rt->m->vocab);
    u.show_events = show_events;
    u.out = out;
    if (out) memset(out, 0, sizeof *out);
    if (show_events && rt->thr.valid)
        fprintf(stderr, "uncertainty: a page of %d tokens crosses at mean H > %.3f or Var(H) > %.3f (%s); at most %d "
                "regenerations per answer\n", unc_page_size(rt->mon), rt->thr.h_mean, rt->thr.h_var, rt->thr.source,
                rt->backtrack);
    else if (show_events)
        fprintf(stderr, "uncertainty: no thresholds for this model (run kvchat calibrate): statistics only\n");
    gen_opts go = { n_predict, prev_token, &rt->thr, rt->backtrack, samp_temperature(s), show_events };
    gen_callbacks cb = { &u, on_token, on_page, on_event };
    int rc = gen_answer(rt->f, s, rt->m->vocab, rt->mon, logits, rt->m->hp.n_vocab, &go, &cb, &cli_interrupted, res,
                        err, errlen);
    char piece[512];
    size_t w = tok_stream_flush(&u.ts, piece, sizeof piece);
    fwrite(piece, 1, w, stdout);
    answer_text(out, piece, w);
    fputc('\n', stdout);
    *stop_note = res->stop == GEN_STOP_INTERRUPT ? " (interrupted)" : res->stop == GEN_STOP_CONTEXT ? " (context full)" : "";
    if (show_events || res->events)
        fprintf(stderr, "uncertainty: %d pages crossed a threshold, %d regenerated (%lld tokens generated again)\n",
                res->events, res->regenerated, (long long)unc_regenerated_tokens(rt->mon));
    return rc;
}

static int parse_pair(const char *spec, double *a, double *b)
{
    char *end;
    *a = strtod(spec, &end);
    if (end == spec || *end != ',') return -1;
    const char *q = end + 1;
    *b = strtod(q, &end);
    return end == q || *end || *a < 0 || *b < 0 ? -1 : 0;
}

int cli_thresholds_path(const char *fingerprint, char *buf, size_t cap, int create_dirs)
{
    char dir[900];
    if (store_data_dir(dir, sizeof dir, create_dirs)) return -1;
    size_t L = strlen(dir);
    snprintf(dir + L, sizeof dir - L, "/thresholds");
    if (create_dirs && mkdir(dir, 0755) != 0 && errno != EEXIST) return -1;
    snprintf(buf, cap, "%s/%s.txt", dir, fingerprint);
    return 0;
}

/* The thresholds the database holds for this model file, if it knows the file (no hashing here). */
static int thresholds_from_db(const char *model_path, const char *db_path, unc_thresholds *t)
{
    char def[1024], uri[1200], err[1200], sha[65];
    struct stat st, ms;
    if (!db_path) {
        if (store_default_path(def, sizeof def, 0)) return -1;   /* only looked at: nothing is created */
        db_path = def;
    }
    if (stat(db_path, &st) != 0 || stat(model_path, &ms) != 0) return -1;
    snprintf(uri, sizeof uri, "file:%s?mode=ro", db_path);
    store *db = store_open(uri, err, sizeof err);
    if (!db) return -1;
    int64_t id;
    int rc = store_model_cached_sha(db, model_path, (int64_t)ms.st_size, (int64_t)ms.st_mtime, sha) == 0 &&
                     store_model_id(db, sha, &id) == 0 && store_thresholds_get(db, id, t) == 0
                 ? 0
                 : -1;
    if (rc == 0) snprintf(t->source, sizeof t->source, "the session database %.400s", db_path);
    store_close(db);
    return rc;
}

int cli_find_thresholds(const char *model_path, const char *spec, const char *db_path, unc_thresholds *t)
{
    char err[600], path[1200], fp[17];
    memset(t, 0, sizeof *t);
    if (spec) {
        double h, v;
        if (parse_pair(spec, &h, &v) == 0) {
            t->valid = 1;
            t->h_mean = h;
            t->h_var = v;
            snprintf(t->source, sizeof t->source, "--thresholds %s", spec);
            return 0;
        }
        if (unc_thresholds_load(spec, t, err, sizeof err)) {
            cli_err("--thresholds: %s (give a file from kvchat calibrate, or MEAN_H,VAR_H)", err);
            return -1;
        }
        return 0;
    }
    if (thresholds_from_db(model_path, db_path, t) == 0) return 0;
    memset(t, 0, sizeof *t);
    if (model_fingerprint(model_path, fp, err, sizeof err)) return 0;   /* the model loaded, so this is rare */
    if (cli_thresholds_path(fp, path, sizeof path, 0) == 0 && access(path, R_OK) == 0 &&
        unc_thresholds_load(path, t, err, sizeof err) == 0)
        return 0;
    /* shipped with kvchat: models/thresholds/ next to the executable */
    char exe[1024];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        snprintf(path, sizeof path, "%s/models/thresholds/%s.txt", exe, fp);
        if (access(path, R_OK) == 0 && unc_thresholds_load(path, t, err, sizeof err) == 0) return 0;
    }
    memset(t, 0, sizeof *t);
    return 0;
}
