/* cli.c - helpers shared by the subcommands (see cli.h). */
#include "app/cli.h"

#include "app/build_commit.h"   /* KVCHAT_BUILD_COMMIT: written by the Makefile into the build directory */

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/files.h"
#include "common/text.h"
#include "engine/document.h"
#include "engine/model.h"
#include "engine/prompt.h"
#include "store/store.h"

volatile sig_atomic_t cli_interrupted = 0;

static void on_stop_signal(int sig)
{
    /* A second Ctrl-C while the first is being honoured exits at once; a repeated SIGTERM or SIGHUP
     * (a closing terminal sends several) waits for the clean stop, which removes temporary files. */
    if (cli_interrupted && sig == SIGINT) _exit(128 + SIGINT);
    cli_interrupted = sig;
}

void cli_catch_stop_signals(void)
{
    static const int sigs[] = { SIGINT, SIGTERM, SIGHUP };
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction sa, old;
        /* one ignored when kvchat started (nohup, a background job) stays ignored */
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN) continue;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_stop_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(sigs[i], &sa, NULL);
    }
}

void cli_stop_on_closed_output(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_IGN;   /* a closed pipe is then an EPIPE write error, which print_text turns into a stop */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPIPE, &sa, NULL);
}

int cli_interrupt_status(void)
{
    return 128 + (cli_interrupted ? (int)cli_interrupted : SIGINT);
}

void cli_err(const char *fmt, ...)
{
    /* one line, whatever a file name or value in it holds: control characters are shown escaped */
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fputs("kvchat: ", stderr);
    text_put(stderr, msg, 0);
    fputc('\n', stderr);
}

int cli_stdout_tty(void)
{
    static int tty = -1;
    if (tty < 0) tty = isatty(STDOUT_FILENO);
    return tty;
}

void cli_opts_init(cli_opts *o)
{
    memset(o, 0, sizeof *o);
    o->sp = samp_params_default();
    o->backtrack = -1;
}

#define F(field) offsetof(cli_opts, field)
#define S(field) offsetof(samp_params, field)
const opt_def cli_model_opts[] = {
    { "--model", "-m", OPT_STR, F(model_path), 0, 0, NULL, 0, "MODEL", "the GGUF file (default: the default model)", NULL },
    { "--tokenizer", NULL, OPT_STR, F(tokenizer_path), 0, 0, NULL, 0, "FILE.model",
      "a SentencePiece model replacing the file's vocabulary for encoding", NULL },
    { "--threads", "-t", OPT_INT, F(n_threads), 1, 256, NULL, 0, "N", "CPU threads (default: all cores)", NULL },
    { "--ctx", NULL, OPT_I64, F(n_ctx), 16, 1 << 22, NULL, 0, "N", "context limit in tokens (default: the model's)",
      NULL },
    { "--batch", NULL, OPT_INT, F(n_batch), 1, 8192, NULL, 0, "N", "prefill chunk in tokens (default 512)", NULL },
    { "--no-simd", NULL, OPT_FLAG, F(no_simd), 0, 0, NULL, 0, NULL, "the portable kernels only", NULL },
    { "--isa", NULL, OPT_STR, F(isa), 0, 0, NULL, 0, "NAME",
      "the kernels' instruction set: scalar, avx2, avxvnni or avx512 (default: the best this CPU has)", NULL },
    { "--device", NULL, OPT_CHOICE, F(device), 0, 0, "auto|cpu|cuda", 0, NULL,
      "the backend (auto: cuda when a GPU is present in a CUDA build)", NULL },
    OPT_END
};
const opt_def cli_policy_opts[] = {
    { "--policy", NULL, OPT_STR, F(policy), 0, 0, NULL, 0, "SPEC",
      "KV-cache policy, e.g. chess:preset=aggressive, quest:budget=1024, take+chess (default full)", "policy" },
    { "--budget", NULL, OPT_STR, F(budget), 0, 0, NULL, 0, "B",
      "a fraction of the context (0 < B < 1) or a token count, for every policy that has a budget", "budget" },
    { "--page-size", NULL, OPT_INT, F(page_size), 1, 4096, NULL, 0, "P", "KV cache page size in tokens (default 32)",
      "page_size" },
    { "--backtrack", NULL, OPT_INT, F(backtrack), 0, 1 << 20, NULL, 0, "R",
      "regenerate at most R uncertain pages per answer (default 2 with chess, else 0)", NULL },
    { "--thresholds", NULL, OPT_STR, F(thresholds), 0, 0, NULL, 0, "T",
      "a calibration file, or MEAN_H,VAR_H (default: the model's calibration)", NULL },
    { "--show-events", NULL, OPT_FLAG, F(show_events), 0, 0, NULL, 0, NULL,
      "print each answer page's entropy statistics and every backtracking event", NULL },
    { "--stop", NULL, OPT_STRS, F(stop), 0, 0, NULL, 0, "TEXT",
      "end answers where TEXT begins (\\n for a newline); the plain form always stops at its next \\nQuestion:",
      "stop" },
    { "--answer-end", NULL, OPT_CHOICE, F(answer_end), 0, 0, "paragraph|line|turn", 0, NULL,
      "where a plain-form (base model) answer ends: its first blank line (default), line break, or next \\nQuestion:",
      "answer_end" },
    OPT_END
};
/* The sampling options, in two tables that differ only in what --temp says its default is: the
 * commands that answer about a document answer greedily (ask, tui, calibrate), chat and generate
 * sample. */
#define SAMPLING_DEFS(TEMP_HELP) \
    { "--temp", NULL, OPT_FLOAT, S(temperature), 0, 100, NULL, 0, "T", TEMP_HELP, \
      "temperature" }, \
    { "--top-k", NULL, OPT_INT, S(top_k), 0, INT32_MAX, NULL, 0, "K", "keep the K most likely tokens; 0 off (default 40)", \
      "top_k" }, \
    { "--top-p", NULL, OPT_FLOAT, S(top_p), 0, 1, NULL, 0, "P", "nucleus sampling; 1 off (default 0.95)", "top_p" }, \
    { "--min-p", NULL, OPT_FLOAT, S(min_p), 0, 1, NULL, 0, "P", "drop tokens below P x the top probability (default 0.05)", \
      "min_p" }, \
    { "--repeat-penalty", NULL, OPT_FLOAT, S(repeat_penalty), 0.01, 100, NULL, 0, "R", \
      "divide recent tokens' logits by R; 1 off (default 1)", "repeat_penalty" }, \
    { "--repeat-last-n", NULL, OPT_INT, S(repeat_last_n), 0, 4096, NULL, 0, "N", \
      "the recent tokens the penalty looks at (default 64)", NULL }, \
    { "--seed", NULL, OPT_U64, S(seed), 0, (double)INT64_MAX, NULL, 0, "S", "random seed (default 0)", "seed" }, \
    OPT_END
const opt_def cli_sampling_opts[] = { SAMPLING_DEFS("temperature; 0 is greedy (default 0.8)") };
const opt_def cli_greedy_sampling_opts[] = { SAMPLING_DEFS("temperature; 0 is greedy (default 0: greedy, the same "
                                                            "answer every time)") };
#undef SAMPLING_DEFS
const opt_def cli_store_opts[] = {
    { "--db", NULL, OPT_STR, F(db), 0, 0, NULL, 0, "PATH", "the session database (default ~/.local/share/kvchat/kvchat.db)",
      NULL },
    { "--no-db", NULL, OPT_FLAG, F(no_db), 0, 0, NULL, 0, NULL, "save nothing", NULL },
    OPT_END
};
#undef F
#undef S

int cli_parse(int argc, char **argv, const char *usage, const char *about, const opt_group *groups, int n_groups,
              const char **pos, int max_pos, int *n_pos)
{
    char err[600];
    int r = opt_parse(argc, argv, groups, n_groups, pos, max_pos, n_pos, err, sizeof err);
    if (r == OPT_WANT_HELP) {
        opt_help(stdout, usage, about, groups, n_groups);
        return 1;
    }
    if (r < 0) {
        cli_err("%s: %s (see kvchat %s --help)", argv[0], err, argv[0]);
        return -1;
    }
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
    if (o->db && !o->no_db && cli_check_db_path(o->db)) return -1;
    return 0;
}

void cli_policy_help(void)
{
    char buf[8192];
    pol_list(buf, sizeof buf);
    printf("KV-cache policies (--policy NAME[:k=v,...][+NAME...], --budget B):\n%s", buf);
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

const char *cli_model_path(const cli_opts *o, char *buf, size_t cap)
{
    if (o->model_path) return o->model_path;
    const char *path = cli_default_model_path(buf, cap);
    struct stat st;
    if (stat(path, &st) != 0) {
        cli_err("default model not found at %s (run `make model`, or pass -m MODEL.gguf)", path);
        return NULL;
    }
    return path;
}

int cli_set_kernels(const char *isa, int no_simd)
{
    char err[300];
    if (be_cpu_set_kernels(isa, no_simd, err, sizeof err)) {
        cli_err("%s", err);
        return -1;
    }
    return 0;
}

run *cli_run(const cli_opts *o)
{
    char err[1200], pathbuf[1024];
    const char *path = cli_model_path(o, pathbuf, sizeof pathbuf);
    if (!path) return NULL;
    if (cli_set_kernels(o->isa, o->no_simd) != 0) return NULL;
    run_config c;
    memset(&c, 0, sizeof c);
    c.model_path = path;
    c.tokenizer_path = o->tokenizer_path;
    c.device = o->device == CLI_DEV_CUDA ? BE_DEVICE_CUDA : o->device == CLI_DEV_CPU ? BE_DEVICE_CPU : BE_DEVICE_AUTO;
    c.n_threads = o->n_threads;
    c.n_ctx = o->n_ctx;
    c.n_batch = o->n_batch;
    c.page_size = o->page_size;
    c.policy = o->pspec;
    c.budget = o->budget;
    c.sp = o->sp;
    /* a GPU warms up at load (run_config.warm_up); 0 measures the first prompt cold, 1 warms a CPU too */
    const char *warm = getenv("KVCHAT_WARM_UP");
    if (warm && *warm) {
        if (strcmp(warm, "0") && strcmp(warm, "1")) {
            cli_err("KVCHAT_WARM_UP must be 0 (no warm-up at load) or 1 (a warm-up on any device); unset, a GPU "
                    "warms up");
            return NULL;
        }
        c.warm_up = warm[0] == '1' ? 1 : -1;
    }
    if (!o->no_calibration && cli_find_thresholds(path, o->thresholds, o->db, &c.thr)) return NULL;
    run *r = run_create(&c, err, sizeof err);
    if (!r) cli_err("%s", err);
    if (r && run_load_note(r)[0]) fprintf(stderr, "kvchat: note: %s\n", run_load_note(r));
    if (r && run_warning(r)[0]) fprintf(stderr, "kvchat: warning: %s\n", run_warning(r));
    return r;
}

session *cli_session(const cli_opts *o, int64_t n_predict, int format)
{
    char err[1200];
    sess_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.budget, sizeof c.budget, "%s", o->budget ? o->budget : "");
    c.backtrack = o->backtrack;
    c.n_predict = n_predict;
    c.format = format;
    _Static_assert(PROMPT_END_PARAGRAPH == 0 && PROMPT_END_LINE == 1 && PROMPT_END_TURN == 2,
                   "--answer-end's choices are paragraph|line|turn");
    c.answer_end = o->answer_end;
    for (int i = 0; i < o->stop.n && i < SESS_MAX_STOP; i++) {
        /* \n, \t and \\ as the characters they name, so a stop sequence can span lines */
        char *d = c.stop[c.n_stop];
        size_t k = 0;
        for (const char *p = o->stop.v[i]; *p && k + 1 < sizeof c.stop[0]; p++) {
            if (*p == '\\' && (p[1] == 'n' || p[1] == 't' || p[1] == '\\')) {
                p++;
                d[k++] = *p == 'n' ? '\n' : *p == 't' ? '\t' : '\\';
            } else {
                d[k++] = *p;
            }
        }
        d[k] = 0;
        if (k == 0) {
            cli_err("--stop: an empty stop sequence would end every answer at once");
            return NULL;
        }
        c.n_stop++;
    }
    run *r = cli_run(o);
    if (!r) return NULL;
    session *s = sess_create(r, &c, err, sizeof err);
    if (!s) cli_err("%s", err);
    return s;
}

char *cli_read_text_file(const char *path, size_t *len)
{
    char err[1200];
    char *t = doc_load(path, DOC_MAX_BYTES, len, err, sizeof err);
    if (!t) cli_err("%s", err);
    return t;
}

const char *cli_build_commit(void) { return KVCHAT_BUILD_COMMIT; }

const char *cli_figures_commit(void)
{
    const char *env = getenv("KVCHAT_COMMIT");
    return env && env[0] ? env : cli_build_commit();
}

void cli_print_answer_end(const session *s, int show_events)
{
    const sess_answer *a = sess_last_answer(s);
    fputc('\n', stdout);
    fflush(stdout);
    if (show_events || a->gen.events)
        fprintf(stderr, "uncertainty: %d pages crossed a threshold, %d regenerated (%lld tokens generated again)\n",
                a->gen.events, a->gen.regenerated, (long long)unc_regenerated_tokens(run_monitor(sess_run(s))));
}

const char *cli_stop_note(const gen_result *g)
{
    return g->stop == GEN_STOP_INTERRUPT ? " (interrupted)" : g->stop == GEN_STOP_CONTEXT ? " (context full)" : "";
}

/* The file an sqlite URI (file:PATH?query) names, %XX decoded; *memory when its mode is memory. */
static void db_uri_file(const char *uri, char *out, size_t cap, int *memory)
{
    const char *p = uri + 5;
    if (p[0] == '/' && p[1] == '/') {   /* file://localhost/x or file:///x: the authority is skipped */
        const char *slash = strchr(p + 2, '/');
        p = slash ? slash : p + strlen(p);
    }
    size_t n = 0;
    for (; *p && *p != '?' && *p != '#' && n + 1 < cap; p++) {
        if (*p == '%' && isxdigit((unsigned char)p[1]) && isxdigit((unsigned char)p[2])) {
            char hex[3] = { p[1], p[2], 0 };
            out[n++] = (char)strtol(hex, NULL, 16);
            p += 2;
        } else {
            out[n++] = *p;
        }
    }
    out[n] = 0;
    const char *q = *p == '?' ? p : "";
    const char *m = strstr(q, "mode=memory");
    *memory = m && (m[-1] == '?' || m[-1] == '&');
}

int cli_check_db_path(const char *path)
{
    char file[1024];
    int memory = 0;
    if (!strncmp(path, "file:", 5))
        db_uri_file(path, file, sizeof file, &memory);
    else
        snprintf(file, sizeof file, "%s", path);
    /* sqlite would take these as a private temporary or in-memory database: a session "saved" there
     * is gone when kvchat exits */
    if (!file[0]) {
        cli_err("--db '%s': the path is empty; give the session database's file name", path);
        return -1;
    }
    if (memory || !strcmp(file, ":memory:")) {
        cli_err("--db '%s' is an in-memory database, which keeps nothing after kvchat exits; give a file name", path);
        return -1;
    }
    /* sqlite makes its journal beside the database: /dev/null-journal, FIFOs that block */
    struct stat st;
    if (stat(file, &st) == 0 && !S_ISREG(st.st_mode)) {
        cli_err("%s is %s, not a session database", file, files_kind(st.st_mode));
        return -1;
    }
    return 0;
}

store *cli_open_db(const char *path)
{
    char def[1024], err[1200];
    if (!path) {
        if (store_default_path(def, sizeof def, 1)) {
            cli_err("no place for the session database (set HOME or XDG_DATA_HOME, or give --db PATH)");
            return NULL;
        }
        path = def;
    }
    if (cli_check_db_path(path)) return NULL;
    store *db = store_open(path, err, sizeof err);
    if (!db) cli_err("%s", err);
    return db;
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

static void print_text(void *ud, const char *p, size_t n)
{
    (void)ud;
    if (cli_stdout_tty()) {   /* what a model writes is shown, never executed by the terminal */
        char piece[1024];
        snprintf(piece, sizeof piece, "%.*s", (int)(n < sizeof piece ? n : sizeof piece - 1), p);
        text_put(stdout, piece, TEXT_KEEP_NEWLINE | TEXT_KEEP_TAB);
    } else {
        fwrite(p, 1, n, stdout);
    }
    /* nobody reads the answer any more (SIGPIPE ignored: cli_stop_on_closed_output): it stops there */
    if ((fflush(stdout) != 0 || ferror(stdout)) && errno == EPIPE && !cli_interrupted) cli_interrupted = SIGPIPE;
}

static void print_page(void *ud, int64_t page, const unc_stats *st)
{
    if (*(int *)ud)
        fprintf(stderr, "uncertainty: answer page %lld: mean H %.3f, Var(H) %.3f\n", (long long)page, st->mean_h,
                st->var_h);
}

static void print_event(void *ud, const unc_event *e)
{
    if (!*(int *)ud) return;
    char line[1024];
    unc_event_format(e, line, sizeof line);
    fprintf(stderr, "uncertainty: %s\n", line);
}

static void print_note(void *ud, const char *msg)
{
    (void)ud;
    text_put(stderr, msg, 0);
    fputc('\n', stderr);
}

/* A prefill's progress on one terminal line of stderr, rewritten in place and cleared at the end. */
static void print_progress(void *ud, int64_t done, int64_t total)
{
    (void)ud;
    static double t0, last;
    static int64_t prev = -1;
    double now = cli_now();
    if (done <= prev || prev < 0) t0 = now;   /* a new prefill */
    prev = done >= total ? -1 : done;
    if (done >= total) {
        fputs("\r\033[K", stderr);
        return;
    }
    if (now - last < 0.1 && done > 0) return;
    last = now;
    double el = now - t0, rate = el > 0 ? (double)done / el : 0;
    fprintf(stderr, "\r\033[Kprefill %lld/%lld tokens (%.0f%%), %.0f tok/s, %.0f s left (Ctrl-C stops)", (long long)done,
            (long long)total, 100.0 * (double)done / (double)(total > 0 ? total : 1), rate,
            rate > 0 ? (double)(total - done) / rate : 0.0);
    fflush(stderr);
}

sess_callbacks cli_print_callbacks(int *show_events)
{
    sess_callbacks cb = { show_events, isatty(STDERR_FILENO) ? print_progress : NULL, print_text,
                          *show_events ? print_page : NULL, print_event, print_note, NULL, NULL };
    return cb;
}

void cli_print_event_header(const session *s)
{
    const unc_thresholds *t = run_thresholds(sess_run(s));
    char regen[64];
    if (sess_backtrack(s) > 0)
        snprintf(regen, sizeof regen, "at most %d regenerations per answer", sess_backtrack(s));
    else
        snprintf(regen, sizeof regen, "backtracking off (events are only logged)");
    if (t->valid)
        fprintf(stderr, "uncertainty: a page of %d tokens crosses at mean H > %.3f or Var(H) > %.3f (%s); %s\n",
                unc_page_size(run_monitor(sess_run(s))), t->h_mean, t->h_var, t->source, regen);
    else
        fprintf(stderr, "uncertainty: no thresholds for this model (run kvchat calibrate): statistics only\n");
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
    /* only a regular file is looked in (cli_check_db_path refuses the rest where --db is used) */
    if (stat(db_path, &st) != 0 || !S_ISREG(st.st_mode) || stat(model_path, &ms) != 0) return -1;
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

int cli_stdout_done(const char *cmd)
{
    fflush(stdout);
    if (!ferror(stdout)) return 0;
    cli_err("%s: error writing the output", cmd);
    return 1;
}
