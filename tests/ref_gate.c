/* ref_gate.c - the reference checker behind ref_gate.h, compared the way the testdata README says:
 * prompt ids identical; with the reference's greedy ids fed back, top-1 identical at every position
 * and step except genuine ties, and the top logit within tol relative to max(1, |logit|). */
#include "tests/ref_gate.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/forward.h"
#include "engine/model.h"
#include "engine/tokenizer.h"

#define REF_STEPS 32

typedef struct ref_row {
    int32_t id[5];
    float logit[5];
} ref_row;

typedef struct ref_file {
    int32_t n_vocab;
    int32_t *ids;
    int n_ids;
    ref_row *pos;
    int32_t greedy[REF_STEPS];
    int n_greedy;
    ref_row steps[REF_STEPS];
} ref_file;

static void parse_top5(const char *line, ref_row *r)
{
    const char *s = strstr(line, "top5");
    cr_assert(s, "reference line without top5");
    s += 4;
    for (int k = 0; k < 5; k++) {
        while (*s == ' ') s++;
        char *end;
        r->id[k] = (int32_t)strtol(s, &end, 10);
        cr_assert(*end == ':', "bad top5 entry");
        r->logit[k] = strtof(end + 1, &end);
        s = end;
    }
}

static void load_ref(const char *path, ref_file *rf)
{
    FILE *f = fopen(path, "r");
    cr_assert(f, "cannot open %s", path);
    memset(rf, 0, sizeof *rf);
    static char line[1 << 16];
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "n_vocab ", 8)) {
            rf->n_vocab = atoi(line + 8);
        } else if (!strncmp(line, "prompt_tokens ", 14)) {
            rf->n_ids = atoi(line + 14);
            rf->ids = calloc((size_t)rf->n_ids, sizeof *rf->ids);
            rf->pos = calloc((size_t)rf->n_ids, sizeof *rf->pos);
        } else if (!strncmp(line, "ids ", 4)) {
            char *s = line + 4;
            for (int i = 0; i < rf->n_ids; i++) rf->ids[i] = (int32_t)strtol(s, &s, 10);
        } else if (!strncmp(line, "pos ", 4)) {
            char *s = line + 4;
            int i = (int)strtol(s, &s, 10);
            cr_assert(i >= 0 && i < rf->n_ids);
            parse_top5(s, &rf->pos[i]);
        } else if (!strncmp(line, "greedy ", 7)) {
            char *s = line + 7, *end;
            while (rf->n_greedy < REF_STEPS) {
                long v = strtol(s, &end, 10);
                if (end == s) break;
                rf->greedy[rf->n_greedy++] = (int32_t)v;
                s = end;
            }
        } else if (!strncmp(line, "step ", 5)) {
            char *s = line + 5;
            int t = (int)strtol(s, &s, 10);
            cr_assert(t >= 0 && t < REF_STEPS);
            parse_top5(s, &rf->steps[t]);
        }
    }
    fclose(f);
}

static char *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    char *buf = malloc(1 << 20);
    *n = fread(buf, 1, (1 << 20) - 1, f);   /* room for the terminator */
    buf[*n] = 0;
    fclose(f);
    return buf;
}

/* A path under the test-data directory; one too long for buf fails the test rather than opening a
 * truncated name. */
static void td_path(char *buf, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, len, fmt, ap);
    va_end(ap);
    cr_assert(n >= 0 && (size_t)n < len, "test-data path too long");
}

typedef struct checker {
    const ref_file *rf;
    float tol;
    const char *what;
    double worst;       /* largest relative top-logit difference seen */
    int ties_skipped;
} checker;

static int32_t argmax(const float *l, int32_t n)
{
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

static void check_row(checker *c, const ref_row *r, const float *l, int32_t nv, const char *kind, int64_t i)
{
    int32_t top = argmax(l, nv);
    float scale = fmaxf(1.0f, fabsf(r->logit[0]));
    double rel = fabs((double)l[top] - r->logit[0]) / scale;
    if (rel > c->worst) c->worst = rel;
    cr_expect(rel <= c->tol, "%s: %s %lld: top logit %f vs reference %f (relative %.2e > %.0e)", c->what, kind,
              (long long)i, l[top], r->logit[0], rel, c->tol);
    if (top != r->id[0]) {
        int tie = (r->logit[0] - r->logit[1]) < c->tol * scale;
        if (tie) c->ties_skipped++;
        cr_expect(tie, "%s: %s %lld: top-1 %d (%f) but reference %d (%f), reference top-2 gap %.2e", c->what, kind,
                  (long long)i, top, l[top], r->id[0], r->logit[0], r->logit[0] - r->logit[1]);
    }
}

static void on_pos(void *ud, int64_t pos, const float *l)
{
    checker *c = ud;
    check_row(c, &c->rf->pos[pos], l, c->rf->n_vocab, "pos", pos);
}

void ref_gate_run(be_backend *b, const char *testdata, const char *model_name, const char *prompt, float tol,
                  const char *note, ref_gate_result *out)
{
    char mpath[1024], rpath[1024], ppath[1024], lpath[1024], err[512];
    td_path(mpath, sizeof mpath, "%s/tiny/%s.gguf", testdata, model_name);
    td_path(rpath, sizeof rpath, "%s/tiny/ref/%s.%s.txt", testdata, model_name, prompt);
    td_path(ppath, sizeof ppath, "%s/prompts/%s.txt", testdata, prompt);
    td_path(lpath, sizeof lpath, "%s/tiny/ref/%s.%s.last_logits.f32", testdata, model_name, prompt);
    ref_file rf;
    load_ref(rpath, &rf);
    cr_assert_eq(rf.n_greedy, REF_STEPS);
    model *m = NULL;
    cr_assert(model_load(&m, mpath, NULL, err, sizeof err) == 0, "%s", err);
    cr_assert_eq(m->hp.n_vocab, rf.n_vocab);
    size_t tlen;
    char *text = read_all(ppath, &tlen);
    int32_t *ids = NULL;
    size_t n = 0;
    cr_assert(tok_encode(m->vocab, text, tlen, 1, 0, &ids, &n, err, sizeof err) == 0, "%s", err);
    cr_assert_eq((int)n, rf.n_ids, "prompt token count %zu vs reference %d", n, rf.n_ids);
    for (size_t i = 0; i < n; i++) cr_assert_eq(ids[i], rf.ids[i], "prompt id %zu: %d vs reference %d", i, ids[i], rf.ids[i]);
    fwd_opts fo = { 2048, 0, 0 };
    fwd_ctx *f = fwd_create(m, b, &fo, err, sizeof err);
    cr_assert(f, "%s", err);
    char what[256];
    snprintf(what, sizeof what, "%s/%s on %s%s", model_name, prompt, b->ops->name, note);
    checker c = { &rf, tol, what, 0, 0 };
    float *logits = malloc(sizeof(float) * (size_t)rf.n_vocab);
    cr_assert(fwd_eval(f, ids, (int64_t)n, logits, on_pos, &c, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    /* The full logit vector after the prompt, against the reference file. */
    FILE *lf = fopen(lpath, "rb");
    cr_assert(lf, "cannot open %s", lpath);
    float *ref_last = malloc(sizeof(float) * (size_t)rf.n_vocab);
    cr_assert_eq(fread(ref_last, sizeof(float), (size_t)rf.n_vocab, lf), (size_t)rf.n_vocab);
    fclose(lf);
    double max_abs = 0;
    for (int32_t i = 0; i < rf.n_vocab; i++) max_abs = fmax(max_abs, fabs((double)logits[i] - ref_last[i]));
    for (int t = 0; t < REF_STEPS; t++) {
        cr_assert(fwd_decode(f, rf.greedy[t], logits, NULL, err, sizeof err) == 0, "%s", err);
        check_row(&c, &rf.steps[t], logits, rf.n_vocab, "step", t);
    }
    cr_log_info("%s: worst top-logit difference %.2e relative, %d genuine ties, last-logits max |diff| %.2e", what,
                c.worst, c.ties_skipped, max_abs);
    if (out) *out = (ref_gate_result){ c.worst, c.ties_skipped, max_abs };
    free(ref_last);
    free(logits);
    free(ids);
    free(text);
    fwd_free(f);
    model_free(m);
    free(rf.ids);
    free(rf.pos);
}
