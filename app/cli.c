/* cli.c - helpers shared by the subcommands (see cli.h). */
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "quant.h"
#include "tokenizer.h"
#include "vec_dot.h"

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

void cli_err(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("kvchat: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

void cli_opts_init(cli_opts *o)
{
    memset(o, 0, sizeof *o);
    o->sp = samp_params_default();
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
    rt->b = be_cpu_create(o->n_threads, err, sizeof err);
    if (!rt->b) {
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
        pol_spec spec = o->pspec;
        if (spec.n == 0 && pol_parse(&spec, o->policy, o->budget, err, sizeof err)) {
            cli_err("%s", err);
            cli_close(rt);
            return -1;
        }
        pol_env env;
        fwd_policy_env(rt->f, &env);
        rt->ps = pol_set_create(&spec, &env, err, sizeof err);
        if (!rt->ps) {
            cli_err("%s", err);
            cli_close(rt);
            return -1;
        }
        fwd_set_policy(rt->f, rt->ps);
    }
    return 0;
}

void cli_close(cli_runtime *rt)
{
    fwd_free(rt->f);
    pol_set_free(rt->ps);
    be_free(rt->b);
    model_free(rt->m);
    memset(rt, 0, sizeof *rt);
}

char *cli_read_text_file(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        cli_err("%s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(fp), &st) != 0 || S_ISDIR(st.st_mode)) {
        cli_err("%s: is a directory", path);
        fclose(fp);
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf) {
            cli_err("%s: out of memory", path);
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
        cli_err("%s: read error", path);
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    if (memchr(buf, 0, n)) {
        cli_err("%s: binary file (contains NUL bytes at byte %zu), expected text", path,
                (size_t)((char *)memchr(buf, 0, n) - buf));
        free(buf);
        return NULL;
    }
    int64_t bad = tok_utf8_invalid_at(buf, n);
    if (bad >= 0) {
        cli_err("%s: invalid UTF-8 at byte %lld", path, (long long)bad);
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
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

int cli_stream_answer(cli_runtime *rt, samp *s, float *logits, int64_t n_predict, int64_t *n_gen,
                      const char **stop_note, char *err, size_t errlen)
{
    tok_stream ts;
    tok_stream_init(&ts, rt->m->vocab);
    char piece[512];
    *n_gen = 0;
    *stop_note = "";
    int rc = 0;
    while (*n_gen < n_predict) {
        if (cli_interrupted) {
            *stop_note = " (interrupted)";
            break;
        }
        int32_t id = samp_sample(s, logits);
        if (tok_is_eog(rt->m->vocab, id)) break;
        samp_accept(s, id);
        ++*n_gen;
        size_t w = tok_stream_feed(&ts, id, piece, sizeof piece);
        if (w) {
            fwrite(piece, 1, w, stdout);
            fflush(stdout);
        }
        if (*n_gen == n_predict) break;
        if (fwd_pos(rt->f) >= fwd_n_ctx(rt->f)) {
            *stop_note = " (context full)";
            break;
        }
        if (fwd_decode(rt->f, id, logits, &cli_interrupted, err, errlen)) {
            if (cli_interrupted) {
                *stop_note = " (interrupted)";
                break;
            }
            rc = -1;
            break;
        }
    }
    size_t w = tok_stream_flush(&ts, piece, sizeof piece);
    fwrite(piece, 1, w, stdout);
    fputc('\n', stdout);
    return rc;
}
