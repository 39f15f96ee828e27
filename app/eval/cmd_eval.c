/* cmd_eval.c - `kvchat eval`: quality and speed of KV-cache policies on generated tasks.
 *
 * For each length, task and sample (tasks.c makes the document, questions and answers), the
 * questions are first asked without the document (the control: what the model knows anyway), then
 * by every configuration (policy x budget x backtracking). Decode-time policies share one prefill
 * with the full cache: the cache goes back to the prompt's end and each configuration adopts the
 * prompt (so every one starts from the same cache and logits). Prefill policies get their own
 * prefill. A multi-turn sample asks its later questions on the cache the earlier ones
 * left; the ppl task teacher-forces the document's continuation instead of answering.
 *
 * Every record is a CSV row written when known; a run given the same CSV skips the rows already
 * there (evalres.c), so an interrupted run continues. At the end: a Markdown summary and, with
 * --out, the plots (evalplot.c). docs/eval.md is the reference. */
#include <errno.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "app/cli.h"
#include "app/commands.h"
#include "app/eval/evalplot.h"
#include "app/eval/evalres.h"
#include "common/files.h"
#include "engine/prompt.h"
#include "app/eval/tasks.h"

static int split_list(const char *list, char out[][32], int max)
{
    int n = 0;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", list);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == max) return -1;
        snprintf(out[n++], 32, "%s", t);
    }
    return n;
}

/* "2K" is 2048 tokens */
static int parse_len(const char *s, int64_t *out)
{
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s) return -1;
    if (*end == 'K' || *end == 'k') {
        v *= 1024;
        end++;
    }
    if (*end || v < 64 || v > (1 << 20)) return -1;
    *out = v;
    return 0;
}

/* ---- progress -------------------------------------------------------------------------------- */

/* Work is counted in prefill-token equivalents (a decoded token costs about six), so the ETA holds
 * across tasks with and without their own prefills. */
typedef struct progress {
    double total, done, t0, last;
    int tty;
} progress;

static void progress_show(progress *p, const char *what, int force)
{
    double now = cli_now();
    if (!force && now - p->last < (p->tty ? 0.5 : 30.0)) return;
    p->last = now;
    double frac = p->total > 0 ? p->done / p->total : 1;
    if (frac > 1) frac = 1;
    char bar[25];
    for (int i = 0; i < 24; i++) bar[i] = i < (int)(frac * 24) ? '#' : '-';
    bar[24] = 0;
    char eta[32] = "--";
    if (p->done > 0) {
        double left = (now - p->t0) * (p->total - p->done) / p->done;
        if (left < 0) left = 0;
        snprintf(eta, sizeof eta, "%dh%02dm%02ds", (int)(left / 3600), (int)(left / 60) % 60, (int)left % 60);
    }
    fprintf(stderr, "%s[%s] %3.0f%%  ETA %s  %-48.48s%s", p->tty ? "\r" : "", bar, 100 * frac, eta, what,
            p->tty ? "" : "\n");
    fflush(stderr);
}

/* ---- one run --------------------------------------------------------------------------------- */

typedef struct eval_cfg {
    pol_spec spec;
    char policy[256], budget[32];
    int backtrack;        /* as asked (-1: the policy's default) */
    int has_prefill;
} eval_cfg;

typedef struct ev {
    cli_opts *o;
    run *r;               /* each configuration attaches its own policies to it */
    const model *m;
    float *shared_logits; /* the shared prefill's last logits */
    int32_t nv;
    const eval_cfg *attached;   /* the configuration of the run (NULL: none, full attention) */
    int chat;             /* the model has a chat template */
    int shared;           /* the full-cache prefill of the current prompt is in the cache */
    int together;         /* --together: decode-time configurations of a sample answer together */
    FILE *out;
    eval_recs recs;
    progress pg;
    const filler *filler;         /* the documents' filler text */
    volatile sig_atomic_t stop;   /* an answer line ended (multi-turn) or Ctrl-C */
    char err[600];
} ev;

typedef struct answer_buf {
    tok_stream ts;
    const tok_vocab *v;
    char text[1024];
    size_t n;
    int64_t n_tok, line_end;   /* tokens received; index of the token that ended the first line (-1) */
    int stop_at_line;
    volatile sig_atomic_t *stop;
} answer_buf;

static void on_token(void *ud, int32_t id)
{
    answer_buf *a = ud;
    char piece[512];
    size_t w = tok_stream_feed(&a->ts, id, piece, sizeof piece);
    if (w > sizeof piece - 1) w = sizeof piece - 1;
    piece[w] = 0;
    if (a->stop_at_line && a->line_end < 0) {
        int content = 0;
        for (size_t i = 0; i < a->n; i++) content |= a->text[i] != ' ';
        char *nl = strchr(piece, '\n');
        for (char *c = piece; nl && c < nl; c++) content |= *c != ' ';
        if (nl && content) {   /* the answer's line is over: this token is not part of it */
            a->line_end = a->n_tok;
            *a->stop = 1;
            w = (size_t)(nl - piece);
        }
    }
    if (a->line_end < 0 || a->line_end == a->n_tok) {
        if (w > sizeof a->text - 1 - a->n) w = sizeof a->text - 1 - a->n;
        memcpy(a->text + a->n, piece, w);
        a->n += w;
        a->text[a->n] = 0;
    }
    a->n_tok++;
    if (cli_interrupted) *a->stop = 1;
}

/* Attach configuration cfg (NULL: none) for a prompt of n tokens. 0, or 1 when its budget is
 * refused (why in E->err). */
static int attach(ev *E, const eval_cfg *cfg, int64_t n)
{
    E->attached = cfg;
    if (run_set_policy(E->r, NULL, E->err, sizeof E->err)) return -1;   /* the last configuration's go */
    if (!cfg) return 0;
    return run_check_policy(E->r, &cfg->spec, n, E->err, sizeof E->err) ? 1 : 0;
}

/* The prompt under the attached configuration. A prefill policy prefills it itself. A decode-time
 * configuration takes the shared full-cache prefill (made once per sample, with no policy): the cache
 * goes back to the prompt's end, the policy adopts the prompt (run_adopt_policy) and the prompt's last
 * logits are the saved ones. So every decode-time configuration, whichever runs first, starts from the
 * same cache and logits, those `kvchat ask` computes. (Until issue 22 the first one did and the others
 * evaluated the prompt's last token again after a rollback: equal in exact arithmetic, a few ulps apart
 * in floating point, which flipped answers the 270M model wins by a hair.) */
static int prefill(ev *E, const int32_t *ids, size_t n, int own, double *secs)
{
    double t0 = cli_now();
    run *r = E->r;
    int64_t end = (int64_t)n;
    if (!own && E->shared && run_pos(r) > end && run_rewind(r, end, end, E->err, sizeof E->err)) E->shared = 0;
    if (own || !E->shared) {
        if (run_set_policy(r, own ? &E->attached->spec : NULL, E->err, sizeof E->err) ||
            run_rewind(r, 0, 0, E->err, sizeof E->err))
            return -1;
        run_reset_peak(r);
        if (run_feed(r, ids, end, NULL, NULL, E->err, sizeof E->err)) return -1;
        run_set_floor(r, end);
        E->shared = !own;   /* a prefill policy's cache is its own */
        if (!own) memcpy(E->shared_logits, run_logits(r), sizeof(float) * (size_t)E->nv);
    }
    if (!own) {
        if (E->attached && run_adopt_policy(r, &E->attached->spec, E->err, sizeof E->err)) return -1;
        run_set_logits(r, E->shared_logits);
    }
    *secs = cli_now() - t0;
    return 0;
}

static void kv_figures(const run *r, eval_rec *rec)
{
    run_figures fg;
    run_get_figures(r, &fg);
    rec->kv_bytes = fg.kv_held;
    rec->kv_peak = fg.kv_peak;
    rec->kv_full = fg.kv_full;
}

static int record(ev *E, const eval_rec *r)
{
    if (E->out) evalres_write(E->out, r);
    if (evalres_push(&E->recs, r)) {
        snprintf(E->err, sizeof E->err, "out of memory");
        return -1;
    }
    return 0;
}

/* An answer's buffer, its stop flag raised at its line's end (multi-turn) or on Ctrl-C. */
static void answer_start(ev *E, answer_buf *ab, int stop_at_line, volatile sig_atomic_t *stop)
{
    memset(ab, 0, sizeof *ab);
    tok_stream_init(&ab->ts, E->m->vocab);
    ab->line_end = -1;
    ab->stop_at_line = stop_at_line;
    ab->stop = stop;
    *stop = 0;
}

/* Answer up to n_predict tokens after the prompt in the cache (R regenerations per answer; -1: the
 * policy's own); E->stop ends it (a line's end, Ctrl-C). */
static int answer(ev *E, int R, int64_t n_predict, int stop_at_line, answer_buf *ab, gen_result *gr)
{
    answer_start(E, ab, stop_at_line, &E->stop);
    run_answer_opts ao = { n_predict, 1, R, 1, 0, NULL, 0 };
    gen_callbacks cb = { ab, on_token, NULL, NULL };
    run_set_abort(E->r, &E->stop);
    int rc = run_answer(E->r, &ao, &cb, gr, E->err, sizeof E->err);
    run_set_abort(E->r, &cli_interrupted);
    return rc;
}

static void expected_text(const task_item *it, int q, char *buf, size_t cap)
{
    buf[0] = 0;
    for (int i = 0; i < it->n_expect[q]; i++) {
        size_t l = strlen(buf);
        snprintf(buf + l, cap - l, "%s%s", i ? " " : "", it->expect[q][i]);
    }
}

/* Mean negative log-likelihood of cont under teacher forcing from the logits after the prompt,
 * decoding each token through the attached policies. */
static int teacher_force(ev *E, const int32_t *cont, size_t n, double *nll)
{
    *nll = 0;
    for (size_t i = 0; i < n; i++) {
        const float *l = run_logits(E->r);
        float mx = l[0];
        for (int32_t k = 1; k < E->nv; k++) mx = l[k] > mx ? l[k] : mx;
        double z = 0;
        for (int32_t k = 0; k < E->nv; k++) z += exp((double)(l[k] - mx));
        *nll += log(z) + (double)mx - (double)l[cont[i]];
        if (i + 1 < n && run_decode(E->r, cont[i], E->err, sizeof E->err)) return -1;
    }
    *nll /= (double)(n ? n : 1);
    return 0;
}

typedef struct item_ctx {
    const char *task;
    int64_t ctx;
    int sample;
    const task_item *it;
    int32_t *ids;          /* the first prompt (document and first question; ppl: the document) */
    size_t n_ids;
    int64_t n_question;    /* the first question's tokens at the prompt's end (ppl: 0) */
    int32_t *cont;         /* ppl: the continuation's tokens */
    size_t n_cont;
    int control[TASK_MAX_Q];
    int64_t n_predict;
} item_ctx;

static void rec_base(const item_ctx *I, int q, eval_rec *r)
{
    evalres_init(r);
    snprintf(r->task, sizeof r->task, "%s", I->task);
    r->ctx = I->ctx;
    r->tokens = (int64_t)I->n_ids;
    r->sample = I->sample;
    r->turn = q;
    r->depth = I->it->depth[q];
    r->control = I->control[q];
    expected_text(I->it, q, r->expected, sizeof r->expected);
}

/* The questions without the document (ppl: the continuation after BOS alone). */
static int eval_control(ev *E, item_ctx *I)
{
    const task_item *it = I->it;
    if (attach(E, NULL, 0) < 0) return -1;
    E->shared = 0;
    for (int q = 0; q < it->n_q; q++) {
        long have = evalres_find(&E->recs, I->task, I->ctx, I->sample, q, "nodoc", "-", 0);
        if (have >= 0) {
            I->control[q] = E->recs.v[have].correct;
            continue;
        }
        eval_rec r;
        rec_base(I, q, &r);
        snprintf(r.policy, sizeof r.policy, "nodoc");
        double t0 = cli_now();
        int32_t *ids = NULL;
        size_t n = 0;
        if (it->kind == TASK_LOGLIK) {
            /* BOS alone as the prompt (a model without one starts from the continuation's first token) */
            int has_bos = tok_bos(E->m->vocab) >= 0;
            int32_t bos = has_bos ? tok_bos(E->m->vocab) : I->cont[0];
            double nll;
            int32_t *c = has_bos ? I->cont : I->cont + 1;
            size_t nc = has_bos ? I->n_cont : I->n_cont - 1;
            if (run_rewind(E->r, 0, 0, E->err, sizeof E->err)) return -1;
            run_reset_peak(E->r);
            if (run_feed(E->r, &bos, 1, NULL, NULL, E->err, sizeof E->err) || teacher_force(E, c, nc, &nll)) return -1;
            r.ppl = exp(nll);
            r.answer_tokens = (int64_t)nc;
            r.tokens = 1;
        } else {
            int rc;
            if (E->chat) rc = prompt_conversation(E->m, 1, "", NULL, 0, it->question[q], &ids, &n, E->err, sizeof E->err);
            else {
                char text[256];
                snprintf(text, sizeof text, "Question: %s\nAnswer:", it->question[q]);
                rc = tok_encode(E->m->vocab, text, strlen(text), tok_add_bos(E->m->vocab), 0, &ids, &n, E->err,
                                sizeof E->err);
            }
            if (rc || run_rewind(E->r, 0, 0, E->err, sizeof E->err)) {
                free(ids);
                return -1;
            }
            run_reset_peak(E->r);
            if (run_feed(E->r, ids, (int64_t)n, NULL, NULL, E->err, sizeof E->err)) {
                free(ids);
                return -1;
            }
            run_reset_sampler(E->r);
            answer_buf ab;
            gen_result gr;
            rc = answer(E, 0, I->n_predict, it->n_q > 1, &ab, &gr);
            free(ids);
            if (rc) return -1;
            r.tokens = (int64_t)n;
            r.correct = task_check(it, q, ab.text);
            r.answer_tokens = gr.n_gen;
            snprintf(r.answer, sizeof r.answer, "%.255s", ab.text);
        }
        r.seconds = cli_now() - t0;
        r.control = -1;
        kv_figures(E->r, &r);
        I->control[q] = r.correct;
        if (record(E, &r)) return -1;
        if (cli_interrupted) return -1;
    }
    return 0;
}

/* A record of configuration cfg's turn q. */
static void rec_config(const item_ctx *I, int q, const eval_cfg *cfg, eval_rec *r)
{
    rec_base(I, q, r);
    snprintf(r->policy, sizeof r->policy, "%s", cfg->policy);
    snprintf(r->budget, sizeof r->budget, "%s", cfg->budget);
    r->backtrack = cfg->backtrack;
}

/* This budget cannot work at this length (why in E->err): said in the rows. 0, or -1. */
static int refused(ev *E, const item_ctx *I, const eval_cfg *cfg)
{
    for (int q = 0; q < I->it->n_q; q++) {
        eval_rec r;
        rec_config(I, q, cfg, &r);
        snprintf(r.status, sizeof r.status, "refused: %.80s", E->err);
        if (record(E, &r)) return -1;
    }
    return 0;
}

/* The answer of turn q into its record; the cache then keeps the answer's line (multi-turn), not
 * the token that ended it (nor what a backtracking page generated past it): the next question
 * follows what the cache holds (an answer cut at its length leaves its last token out). pos0: where
 * the answer began. 0, or -1. */
static int answered(ev *E, const item_ctx *I, run *r, int q, int64_t pos0, const answer_buf *ab, const gen_result *gr,
                    eval_rec *rec)
{
    rec->correct = task_check(I->it, q, ab->text);
    rec->answer_tokens = gr->n_gen;
    snprintf(rec->answer, sizeof rec->answer, "%.255s", ab->text);
    if (q + 1 >= I->it->n_q) return 0;
    int64_t keep = pos0 + (ab->line_end >= 0 ? ab->line_end : gr->n_gen);
    if (keep > run_pos(r)) keep = run_pos(r);
    return run_rewind(r, keep, keep, E->err, sizeof E->err) ? -1 : 0;
}

/* The next question (turn q > 0) on the cache the earlier turns left; its evaluation's seconds. */
static int next_question(ev *E, const item_ctx *I, run *r, int q, double *secs)
{
    int32_t *next = NULL;
    size_t nn = 0;
    if (prompt_continue(E->m, E->chat, I->it->question[q], &next, &nn, E->err, sizeof E->err)) return -1;
    double t1 = cli_now();
    run_set_question(r, (int64_t)nn);
    int bad = run_feed(r, next, (int64_t)nn, NULL, NULL, E->err, sizeof E->err);
    *secs = cli_now() - t1;
    free(next);
    return bad ? -1 : 0;
}

/* One configuration on one sample: every question (turn) of it, or the teacher-forced continuation. */
static int eval_config(ev *E, item_ctx *I, const eval_cfg *cfg)
{
    const task_item *it = I->it;
    int rc = attach(E, cfg, (int64_t)I->n_ids);
    if (rc < 0) return -1;
    if (rc > 0) return refused(E, I, cfg);   /* this budget cannot work at this length: go on */
    double pf_s;
    run_set_question(E->r, I->n_question);   /* the task-aware policies probe with the question */
    if (prefill(E, I->ids, I->n_ids, cfg->has_prefill, &pf_s)) return -1;
    int64_t pos0 = (int64_t)I->n_ids;
    run_reset_sampler(E->r);
    for (int q = 0; q < it->n_q; q++) {
        eval_rec r;
        rec_config(I, q, cfg, &r);
        r.prefill_s = q == 0 ? pf_s : 0;
        double t0 = cli_now();
        if (q > 0) {
            if (next_question(E, I, E->r, q, &r.prefill_s)) return -1;
            pos0 = run_pos(E->r);
        }
        if (it->kind == TASK_LOGLIK) {
            double nll;
            double t1 = cli_now();
            if (teacher_force(E, I->cont, I->n_cont, &nll)) return -1;
            r.decode_s = cli_now() - t1;
            r.ppl = exp(nll);
            r.answer_tokens = (int64_t)I->n_cont;
        } else {
            answer_buf ab;
            gen_result gr;
            double t1 = cli_now();
            if (answer(E, cfg->backtrack, I->n_predict, it->n_q > 1, &ab, &gr)) return -1;
            r.decode_s = cli_now() - t1;
            if (cli_interrupted || answered(E, I, E->r, q, pos0, &ab, &gr, &r)) return -1;
        }
        r.seconds = cli_now() - t0 + (q == 0 ? pf_s : 0);
        kv_figures(E->r, &r);
        if (record(E, &r)) return -1;
    }
    return 0;
}

/* --together: n decode-time configurations of one sample (not ppl) from one shared prefill, a fork of
 * the cache each (run_fork: pages shared, the policy adopting the prompt, as prefill() attaches
 * one), every turn's answers decoded together (run_answer_batch). A configuration's answers are
 * the ones eval_config gives; its decode_s is the batch's time (shared by the configurations
 * answered together). 0, or -1. */
static int eval_batch(ev *E, item_ctx *I, const eval_cfg *const *cfgs, int n)
{
    const task_item *it = I->it;
    const eval_cfg *ok[FWD_BATCH_MAX];
    int m = 0;
    for (int i = 0; i < n; i++) {
        int rc = attach(E, cfgs[i], (int64_t)I->n_ids);
        if (rc < 0 || (rc > 0 && refused(E, I, cfgs[i]))) return -1;
        if (rc == 0) ok[m++] = cfgs[i];
    }
    if (attach(E, NULL, 0) < 0) return -1;   /* the shared prefill, under no policy of its own */
    if (!m) return 0;
    double pf_s;
    run_set_question(E->r, I->n_question);
    if (prefill(E, I->ids, I->n_ids, 0, &pf_s)) return -1;
    run_reset_sampler(E->r);
    run *fk[FWD_BATCH_MAX] = { 0 };
    volatile sig_atomic_t stop[FWD_BATCH_MAX];
    answer_buf ab[FWD_BATCH_MAX];
    gen_callbacks cbs[FWD_BATCH_MAX];
    run_answer_opts ao[FWD_BATCH_MAX];
    gen_result gr[FWD_BATCH_MAX];
    eval_rec rec[FWD_BATCH_MAX];
    int64_t pos0[FWD_BATCH_MAX];
    int rc = 0;
    for (int i = 0; i < m && !rc; i++)
        if (!(fk[i] = run_fork(E->r, &ok[i]->spec, E->err, sizeof E->err))) rc = -1;
    for (int q = 0; q < it->n_q && !rc; q++) {
        for (int i = 0; i < m && !rc; i++) {
            rec_config(I, q, ok[i], &rec[i]);
            rec[i].prefill_s = q == 0 && i == 0 ? pf_s : 0;   /* as the first configuration's alone */
            if (q > 0 && next_question(E, I, fk[i], q, &rec[i].prefill_s)) rc = -1;
            pos0[i] = run_pos(fk[i]);
            answer_start(E, &ab[i], it->n_q > 1, &stop[i]);
            cbs[i] = (gen_callbacks){ &ab[i], on_token, NULL, NULL };
            ao[i] = (run_answer_opts){ I->n_predict, 1, ok[i]->backtrack, 1, 0, NULL, 0 };
        }
        /* each answer stops at its own flag (its line's end), the rest of the time Ctrl-C does */
        for (int i = 0; i < m && !rc; i++) run_set_abort(fk[i], &stop[i]);
        double t1 = cli_now();
        if (!rc && run_answer_batch(E->r, fk, m, ao, cbs, gr, E->err, sizeof E->err)) rc = -1;
        double dec = cli_now() - t1;
        for (int i = 0; i < m; i++)
            if (fk[i]) run_set_abort(fk[i], &cli_interrupted);
        if (rc || cli_interrupted) break;
        for (int i = 0; i < m && !rc; i++) {
            rec[i].decode_s = dec;
            rec[i].seconds = dec + rec[i].prefill_s;
            if (answered(E, I, fk[i], q, pos0[i], &ab[i], &gr[i], &rec[i])) rc = -1;
            kv_figures(fk[i], &rec[i]);
            if (!rc) rc = record(E, &rec[i]);
        }
    }
    for (int i = 0; i < m; i++) run_free(fk[i]);
    return rc || cli_interrupted ? -1 : 0;
}

/* The ppl task's tokens: the document's, and the continuation's as they come out of tokenizing
 * both together (so the boundary is tokenized as in running text), else on their own. */
static int split_continuation(const model *m, const task_item *it, item_ctx *I, char *err, size_t errlen)
{
    const tok_vocab *v = m->vocab;
    size_t ld = strlen(it->doc), lc = strlen(it->cont), n_all = 0;
    char *all = malloc(ld + lc + 1);
    int32_t *ids_all = NULL;
    if (!all) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    memcpy(all, it->doc, ld);
    memcpy(all + ld, it->cont, lc + 1);
    int bad = tok_encode(v, it->doc, ld, tok_add_bos(v), 0, &I->ids, &I->n_ids, err, errlen) ||
              tok_encode(v, all, ld + lc, tok_add_bos(v), 0, &ids_all, &n_all, err, errlen);
    free(all);
    if (!bad && n_all > I->n_ids && !memcmp(ids_all, I->ids, sizeof(int32_t) * I->n_ids)) {
        I->n_cont = n_all - I->n_ids;
        I->cont = malloc(sizeof(int32_t) * I->n_cont);
        if (I->cont) memcpy(I->cont, ids_all + I->n_ids, sizeof(int32_t) * I->n_cont);
        else bad = 1;
    } else if (!bad) {
        bad = tok_encode(v, it->cont, lc, 0, 0, &I->cont, &I->n_cont, err, errlen);
    }
    free(ids_all);
    return bad ? -1 : 0;
}

/* ---- the plan -------------------------------------------------------------------------------- */

/* Characters per token of len bytes of text (4 when it cannot be measured). */
static double chars_per_token(const tok_vocab *v, const char *text, size_t len)
{
    int32_t *t = NULL;
    size_t nt = 0;
    char err[200];
    double cpt = 4.0;
    if (tok_encode(v, text, len, 0, 0, &t, &nt, err, sizeof err) == 0 && nt) cpt = (double)len / (double)nt;
    free(t);
    return cpt;
}

/* The same for a task that repeats its own filler: measured on 64 repetitions, as documents run. */
static double own_chars_per_token(const ev *E, const char *task)
{
    const char *f = task_own_filler(task);
    size_t l = strlen(f), n = 64 * (l + 1);
    char *text = malloc(n + 1);
    if (!text) return 4.0;
    for (int r = 0; r < 64; r++) {
        memcpy(text + (size_t)r * (l + 1), f, l);
        text[(size_t)r * (l + 1) + l] = ' ';
    }
    double cpt = chars_per_token(E->m->vocab, text, n - 1);
    free(text);
    return cpt;
}

static int config_done(const ev *E, const char *task, int64_t ctx, int sample, int n_q, const eval_cfg *c)
{
    for (int q = 0; q < n_q; q++)
        if (evalres_find(&E->recs, task, ctx, sample, q, c->policy, c->budget, c->backtrack) < 0) return 0;
    return 1;
}

static int task_turns(const char *task)
{
    return !strcmp(task, "multiturn") ? 3 : 1;
}

/* Estimated work of a configuration on one sample, in prefill-token equivalents. */
static double cost(const char *task, int64_t ctx, const eval_cfg *c, int64_t n_predict)
{
    double dec = 6.0 * (double)(!strcmp(task, "ppl") ? 150 : n_predict * task_turns(task));
    return (c->has_prefill ? (double)ctx : 0) + dec;
}

/* The CSV for appending: a new file gets the header; an old one must have this version's columns.
 * Never through a link, never a FIFO or device (common/files.h). */
static FILE *open_csv(const char *path, char *err, size_t errlen)
{
    int fresh;
    FILE *f = files_append(path, &fresh, err, errlen);
    if (!f) return NULL;
    if (fresh) {
        fputs(evalres_header, f);
        return f;
    }
    FILE *chk = files_open_read(path, EVALRES_MAX_BYTES, "an eval CSV", err, errlen);
    if (!chk) {
        fclose(f);
        return NULL;
    }
    char line[1024] = "";
    if (!fgets(line, sizeof line, chk) || strcmp(line, evalres_header)) {
        snprintf(err, errlen, "%.400s has other columns (an older kvchat eval): give another --csv or --out", path);
        fclose(f);
        f = NULL;
    }
    fclose(chk);
    return f;
}

/* summary.md and the plots of everything in the CSV. */
static int report(const eval_recs *rs, const char *dir, int n_depths, const char *plot_budget, const char *about)
{
    char path[1024], err[600], made[1024];
    snprintf(path, sizeof path, "%s/summary.md", dir);
    files_atomic fa;   /* replaced whole: a link there is replaced, not followed */
    if (files_atomic_open(&fa, path, err, sizeof err)) {
        cli_err("eval: %s", err);
        return -1;
    }
    fprintf(fa.f, "# kvchat eval summary\n\n%s\n\n", about);
    evalres_summary_md(fa.f, rs);
    if (files_atomic_commit(&fa, err, sizeof err)) {
        cli_err("eval: %s", err);
        return -1;
    }
    if (evalplot_eval(rs, dir, n_depths, plot_budget, made, sizeof made, err, sizeof err)) {
        cli_err("eval: %s", err);
        return -1;
    }
    fprintf(stderr, "eval: wrote %s/summary.md and %s in %s\n", dir, made, dir);
    return 0;
}

typedef struct eval_opts {
    const char *tasks, *policies, *budgets, *backtracks, *csv, *ctx, *samples, *out, *filler, *plot_budget;
    int64_t n_predict, seed, n_depths;
    int report, together;
} eval_opts;

#define O(field) offsetof(eval_opts, field)
static const opt_def eval_defs[] = {
    { "--task", NULL, OPT_STR, O(tasks), 0, 0, NULL, 0, "LIST",
      "passkey, passkey-std, niah, multikey, multivalue, babi1, babi2, ppl, multiturn, or all", NULL },
    { "--ctx", NULL, OPT_STR, O(ctx), 0, 0, NULL, 0, "LIST", "document lengths in tokens, e.g. 2K,4K,8K (default 4000)",
      NULL },
    { "--policy", NULL, OPT_STR, O(policies), 0, 0, NULL, 0, "LIST", "policies, e.g. full,chess,snapkv, or all (default full)",
      NULL },
    { "--budget", NULL, OPT_STR, O(budgets), 0, 0, NULL, 0, "LIST",
      "budgets, e.g. 0.01,0.05,0.1,0.2 (each policy with a budget runs at each)", NULL },
    { "--samples", NULL, OPT_STR, O(samples), 0, 0, NULL, 0, "LIST",
      "samples per length: one value, or one per --ctx length (default 8)", NULL },
    { "--seed", NULL, OPT_I64, O(seed), 0, (double)INT64_MAX, NULL, 0, "S", "seed of the documents (default 1)", NULL },
    { "--depths", NULL, OPT_I64, O(n_depths), 1, 101, NULL, 0, "N", "points of the needle depth sweep of niah and passkey-std (default 5)",
      NULL },
    { "--backtrack", NULL, OPT_STR, O(backtracks), 0, 0, NULL, 0, "LIST",
      "regenerations per answer, e.g. 0,2 (default: the policy's own)", NULL },
    { "--n-predict", "-n", OPT_I64, O(n_predict), 1, 4096, NULL, 0, "N", "answer tokens (default: per task, 12 to 48)",
      NULL },
    { "--filler", NULL, OPT_STR, O(filler), 0, 0, NULL, 0, "F",
      "auto (the King James Bible when installed, else generated), kjv, generated", NULL },
    { "--out", NULL, OPT_STR, O(out), 0, 0, NULL, 0, "DIR", "DIR/samples.csv (resumed when present), DIR/summary.md, plots",
      NULL },
    { "--csv", NULL, OPT_STR, O(csv), 0, 0, NULL, 0, "FILE", "the samples CSV (resumed when present) without the rest",
      NULL },
    { "--plot-budget", NULL, OPT_STR, O(plot_budget), 0, 0, NULL, 0, "B",
      "the budget of the speed and memory plot (default: the middle one)", NULL },
    { "--report", NULL, OPT_FLAG, O(report), 0, 0, NULL, 0, NULL, "no run: the summary and plots of the CSV that is there",
      NULL },
    { "--together", NULL, OPT_FLAG, O(together), 0, 0, NULL, 0, NULL,
      "answer a sample's decode-time configurations together, one batched step for all (faster; their decode_s "
      "is then the batch's)", NULL },
    { "--help", "-h", OPT_HELP, 0, 0, 0, NULL, 0, NULL, "this help", NULL },
    OPT_END
};
#undef O

/* What a run does: the tasks, lengths, samples per length and configurations, in run order. */
typedef struct eval_plan {
    char tasks[16][32];
    int n_task;
    int64_t ctxs[16], samples[16];
    int n_ctx;
    eval_cfg *cfg;
    int n_cfg;
} eval_plan;

/* --report: the summary and plots of the CSV that is there, no run. */
static int report_only(const char *out_dir, const char *csv_path, int n_depths, const char *plot_budget)
{
    if (!out_dir) {
        cli_err("eval: --report needs --out DIR (where samples.csv is)");
        return 1;
    }
    eval_recs rs = { 0 };
    char err[600];
    if (evalres_read(csv_path, &rs, err, sizeof err)) {
        cli_err("eval: %s", err);
        return 1;
    }
    if (rs.n == 0) {
        cli_err("eval: %s has no rows", csv_path);
        return 1;
    }
    evalres_summary_md(stdout, &rs);
    const char *name = strrchr(csv_path, '/') ? strrchr(csv_path, '/') + 1 : csv_path;
    for (const char *c = name; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == '`') name = "the CSV";   /* one line of markdown */
    char about[400];
    snprintf(about, sizeof about, "Made by `kvchat eval --report`, commit %.63s, from the %zu rows of %.120s (each "
             "written by the run that measured it, perhaps of another build).", cli_figures_commit(), rs.n, name);
    int rc = report(&rs, out_dir, n_depths, plot_budget, about);
    evalres_free(&rs);
    return rc ? 1 : 0;
}

/* --task, --ctx and --samples into P. 0, or 1 after printing why not. */
static int plan_items(const eval_opts *eo, eval_plan *P)
{
    if (!eo->tasks) {
        cli_err("eval: give --task (passkey, passkey-std, niah, multikey, multivalue, babi1, babi2, ppl, multiturn or "
                "all)");
        return 1;
    }
    if (!strcmp(eo->tasks, "all"))
        for (const char *const *t = task_names(); *t; t++) snprintf(P->tasks[P->n_task++], 32, "%s", *t);
    else P->n_task = split_list(eo->tasks, P->tasks, 16);
    for (int t = 0; t < P->n_task; t++)
        if (!task_known(P->tasks[t])) {
            cli_err("eval: unknown task '%s' (passkey, passkey-std, niah, multikey, multivalue, babi1, babi2, ppl, "
                    "multiturn)",
                    P->tasks[t]);
            return 1;
        }
    char clist[16][32], slist[16][32];
    P->n_ctx = split_list(eo->ctx, clist, 16);
    int n_smp = split_list(eo->samples, slist, 16);
    if (P->n_task < 1 || P->n_ctx < 1 || (n_smp != 1 && n_smp != P->n_ctx)) {
        cli_err("eval: --task and --ctx take 1 to 16 values, --samples one value or one per length");
        return 1;
    }
    for (int c = 0; c < P->n_ctx; c++) {
        if (parse_len(clist[c], &P->ctxs[c])) {
            cli_err("eval: --ctx: '%s' is not a length from 64 to 1048576 tokens (2K = 2048)", clist[c]);
            return 1;
        }
        const char *sv = slist[n_smp == 1 ? 0 : c];
        char *end;
        P->samples[c] = strtoll(sv, &end, 10);
        if (end == sv || *end || P->samples[c] < 1 || P->samples[c] > 100000) {
            cli_err("eval: --samples: '%s' is not an integer in [1, 100000]", sv);
            return 1;
        }
    }
    return 0;
}

/* One configuration per policy x budget x backtracking (a policy without a budget, such as full,
 * once, not once per budget), decode-time ones first: they share one prefill per sample, which a
 * prefill policy's own prefill would replace. 0, or 1 after printing why not. */
static int plan_configs(const eval_opts *eo, eval_plan *P)
{
    char specs[16][256], blist[8][32], rlist[8][32];
    int n_spec = 0;
    if (!strcmp(eo->policies, "all"))
        for (const pol_ops *const *p = pol_registry(); *p; p++) snprintf(specs[n_spec++], 256, "%s", (*p)->name);
    else n_spec = pol_split_list(eo->policies, specs, 16);
    int n_bud = eo->budgets ? split_list(eo->budgets, blist, 8) : 1;
    int n_bt = eo->backtracks ? split_list(eo->backtracks, rlist, 8) : 1;
    if (!eo->budgets) blist[0][0] = 0;
    if (!eo->backtracks) snprintf(rlist[0], 32, "-1");
    if (n_spec < 1 || n_bud < 1 || n_bt < 1) {
        cli_err("eval: --policy takes 1 to 16 policies, --budget and --backtrack 1 to 8 values");
        return 1;
    }
    int64_t bt[8];
    for (int r = 0; r < n_bt; r++) {
        char *end;
        bt[r] = strtoll(rlist[r], &end, 10);
        if (end == rlist[r] || *end || bt[r] < -1 || bt[r] > (1 << 20)) {
            cli_err("eval: --backtrack: '%s' is not an integer in [-1, %d]", rlist[r], 1 << 20);
            return 1;
        }
    }
    P->cfg = calloc((size_t)(n_spec * n_bud * n_bt), sizeof *P->cfg);
    if (!P->cfg) {
        cli_err("eval: out of memory");
        return 1;
    }
    char err[600] = "";
    for (int p = 0; p < n_spec; p++) {
        pol_spec plain;
        if (pol_parse(&plain, specs[p], NULL, err, sizeof err)) {
            cli_err("eval: %s", err);
            return 1;
        }
        int has_budget = 0, has_prefill = 0;
        for (int k = 0; k < plain.n; k++) {
            has_prefill |= plain.ops[k]->stage == POL_STAGE_PREFILL;
            for (int q = 0; q < plain.ops[k]->n_params; q++) has_budget |= !strcmp(plain.ops[k]->params[q].name, "budget");
        }
        for (int b = 0; b < (has_budget ? n_bud : 1); b++)
            for (int r = 0; r < n_bt; r++) {
                const char *bud = has_budget && blist[b][0] ? blist[b] : NULL;
                eval_cfg *c = &P->cfg[P->n_cfg];
                if (pol_parse(&c->spec, specs[p], bud, err, sizeof err)) {
                    cli_err("eval: %s", err);
                    return 1;
                }
                snprintf(c->policy, sizeof c->policy, "%.255s", specs[p]);
                snprintf(c->budget, sizeof c->budget, "%.31s", bud ? bud : "-");
                c->backtrack = (int)bt[r];
                c->has_prefill = has_prefill;
                P->n_cfg++;
            }
    }
    for (int a = 1; a < P->n_cfg; a++)   /* stable: decode-time configurations first */
        for (int b = a; b > 0 && P->cfg[b].has_prefill < P->cfg[b - 1].has_prefill; b--) {
            eval_cfg t = P->cfg[b];
            P->cfg[b] = P->cfg[b - 1];
            P->cfg[b - 1] = t;
        }
    return 0;
}

/* The plan's work still to do (tokens prefilled and decoded), for the ETA. */
static double plan_cost(const ev *E, const eval_plan *P, int64_t n_predict)
{
    double total = 0;
    for (int c = 0; c < P->n_ctx; c++)
        for (int t = 0; t < P->n_task; t++)
            for (int64_t k = 0; k < P->samples[c]; k++) {
                int64_t np = n_predict ? n_predict : task_answer_tokens(P->tasks[t]);
                int shared_needed = 0;
                for (int j = 0; j < P->n_cfg; j++)
                    if (!config_done(E, P->tasks[t], P->ctxs[c], (int)k, task_turns(P->tasks[t]), &P->cfg[j])) {
                        total += cost(P->tasks[t], P->ctxs[c], &P->cfg[j], np);
                        shared_needed |= !P->cfg[j].has_prefill;
                    }
                if (shared_needed) total += (double)P->ctxs[c];
            }
    return total;
}

/* The prompt of item it into I (the document and question, or the document and the continuation
 * the ppl task scores). 0, or -1 with the reason in err. */
static int item_prompt(ev *E, const task_item *it, item_ctx *I, int turns, char *err, size_t errlen)
{
    int bad;
    if (it->kind == TASK_LOGLIK)
        bad = split_continuation(E->m, it, I, err, errlen);
    else
        bad = prompt_conversation(E->m, E->chat, it->doc, NULL, 0, it->question[0], &I->ids, &I->n_ids, err, errlen);
    if (bad) return -1;
    I->n_question = it->kind == TASK_LOGLIK ? 0 : prompt_question_tokens(E->m, E->chat, it->question[0]);
    if (I->n_ids == 0 || (it->kind == TASK_LOGLIK && I->n_cont == 0)) {
        snprintf(err, errlen, "empty prompt");
        return -1;
    }
    int64_t need = (int64_t)I->n_ids + (int64_t)I->n_cont + I->n_predict * turns + 64 * (turns - 1);
    if (need > run_n_ctx(E->r)) {
        snprintf(err, errlen, "%zu prompt tokens and the answers do not fit the context of %lld", I->n_ids,
                 (long long)run_n_ctx(E->r));
        return -1;
    }
    return 0;
}

/* Sample k of task at length ctx: the control, then every configuration not in the CSV yet.
 * 0, or 1 after printing why it stopped (a failure, or Ctrl-C). */
static int eval_sample(ev *E, const eval_plan *P, const char *task, int64_t ctx, int64_t k, double cpt,
                      const eval_opts *eo, item_ctx *I, task_item *it)
{
    int turns = task_turns(task), pending = 0;
    for (int j = 0; j < P->n_cfg; j++) pending += !config_done(E, task, ctx, (int)k, turns, &P->cfg[j]);
    if (!pending) return 0;
    task_item_free(it);
    free(I->ids);
    free(I->cont);
    memset(I, 0, sizeof *I);
    char err[600];
    if (task_make(task, E->filler, ctx, cpt, (uint64_t)eo->seed, (int)k, (int)eo->n_depths, it, err, sizeof err)) {
        cli_err("eval: %s", err);
        return 1;
    }
    I->task = task;
    I->ctx = ctx;
    I->sample = (int)k;
    I->it = it;
    I->n_predict = eo->n_predict ? eo->n_predict : task_answer_tokens(task);
    for (int q = 0; q < TASK_MAX_Q; q++) I->control[q] = -1;
    if (item_prompt(E, it, I, turns, err, sizeof err)) {
        cli_err("eval: %s", err);
        return 1;
    }
    char what[96];
    snprintf(what, sizeof what, "%s %lld #%lld no document", task, (long long)ctx, (long long)k);
    progress_show(&E->pg, what, 1);
    int failed = eval_control(E, I) != 0;
    E->shared = 0;
    for (int j = 0; j < P->n_cfg && !failed && !cli_interrupted; j++) {
        const eval_cfg *c = &P->cfg[j];
        if (config_done(E, task, ctx, (int)k, turns, c)) continue;
        snprintf(what, sizeof what, "%s %lld #%lld %.40s %.16s", task, (long long)ctx, (long long)k, c->policy,
                 c->budget);
        progress_show(&E->pg, what, 0);
        if (!c->has_prefill && !E->shared) E->pg.done += (double)ctx;
        /* --together: this decode-time configuration and the next ones still to do, in one batch */
        const eval_cfg *group[FWD_BATCH_MAX] = { c };
        int ng = 1;
        while (E->together && !c->has_prefill && it->kind != TASK_LOGLIK && ng < FWD_BATCH_MAX && j + 1 < P->n_cfg &&
               !P->cfg[j + 1].has_prefill)
            if (!config_done(E, task, ctx, (int)k, turns, &P->cfg[++j])) group[ng++] = &P->cfg[j];
        failed = (ng > 1 ? eval_batch(E, I, group, ng) : eval_config(E, I, c)) != 0;
        for (int g = 0; g < ng && !failed; g++) E->pg.done += cost(task, ctx, group[g], I->n_predict);
    }
    if (!failed && !cli_interrupted) return 0;
    cli_err("eval: %s", cli_interrupted ? "interrupted (run the same command again to continue)" : E->err);
    return 1;
}

/* With --out: the summary, the plots and what they came from. 0, or 1 when they could not be
 * written. */
static int write_report(ev *E, const char *out_dir, const eval_opts *eo, const char *filler_source)
{
    char about[1024], date[32];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    snprintf(about, sizeof about,
             "Model %s, commit %.63s, %d threads, filler %s, seed %lld, updated %s. Rows: samples.csv (%zu). "
             "\"answered\": right answers; \"retrieved\": right with the document and wrong without it.",
             E->m->path, cli_figures_commit(), run_threads(E->r), filler_source, (long long)eo->seed, date,
             E->recs.n);
    return report(&E->recs, out_dir, (int)eo->n_depths, eo->plot_budget, about) ? 1 : 0;
}

/* The engine a run drives (the runtime, the shared prefill's logits): 0, or 1 after printing why not. */
static int open_runtime(ev *E, cli_opts *o)
{
    if (!(E->r = cli_run(o))) return 1;
    E->m = run_model(E->r);
    E->nv = E->m->hp.n_vocab;
    E->shared_logits = malloc(sizeof(float) * (size_t)E->nv);
    E->chat = gguf_find_key(E->m->gguf, "tokenizer.chat_template") >= 0;
    if (!E->shared_logits) {
        cli_err("eval: out of memory");
        return 1;
    }
    run_set_abort(E->r, &cli_interrupted);
    /* each configuration attaches its own policies */
    return run_set_policy(E->r, NULL, E->err, sizeof E->err) ? 1 : 0;
}

static void close_runtime(ev *E)
{
    if (E->out) fclose(E->out);
    free(E->shared_logits);
    run_free(E->r);
    evalres_free(&E->recs);
}

int cmd_eval(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    o.sp.temperature = 0;
    eval_opts eo = { NULL, "full", NULL, NULL, NULL, "4000", "8", NULL, "auto", NULL, 0, 1, 5, 0, 0 };
    opt_group g[] = { { eval_defs, &eo, NULL }, CLI_MODEL(&o), CLI_POLICY(&o) };
    int pr = cli_parse(argc, argv, "kvchat eval --task LIST [options]",
                       "Quality and speed of KV-cache policies on generated tasks (docs/eval.md).", g, 3, NULL, 0, NULL);
    if (pr) return pr > 0 ? 0 : 1;
    char csv_path[1024] = "";
    if (eo.out) {
        if (mkdir(eo.out, 0777) != 0 && errno != EEXIST) {
            cli_err("eval: cannot create %s: %s", eo.out, strerror(errno));
            return 1;
        }
        snprintf(csv_path, sizeof csv_path, "%s/samples.csv", eo.out);
    }
    if (eo.csv) snprintf(csv_path, sizeof csv_path, "%s", eo.csv);
    if (eo.report) return report_only(eo.out, csv_path, (int)eo.n_depths, eo.plot_budget);
    eval_plan P;
    memset(&P, 0, sizeof P);
    if (plan_items(&eo, &P) || plan_configs(&eo, &P) || cli_finish_common(&o)) {
        free(P.cfg);
        return 1;
    }
    ev E;
    memset(&E, 0, sizeof E);
    E.o = &o;
    E.together = eo.together;
    filler fl;
    const char *note = NULL;
    char err[600] = "";
    if (filler_load(&fl, eo.filler, &note, err, sizeof err)) {
        cli_err("eval: %s", err);
        free(P.cfg);
        return 1;
    }
    E.filler = &fl;
    if (note) fprintf(stderr, "eval: %s\n", note);
    item_ctx I;
    memset(&I, 0, sizeof I);
    task_item it;
    memset(&it, 0, sizeof it);
    int rc = 1;
    if (csv_path[0]) {
        /* opened first: a FIFO or device there is refused before anything reads it */
        if (!(E.out = open_csv(csv_path, err, sizeof err)) || evalres_read(csv_path, &E.recs, err, sizeof err)) {
            cli_err("eval: %s", err);
            goto done;
        }
        if (E.recs.n) fprintf(stderr, "eval: %s has %zu rows already: those runs are skipped\n", csv_path, E.recs.n);
    }
    if (open_runtime(&E, &o)) goto done;
    cli_catch_stop_signals();
    /* characters per token of this filler (and of a task's own), so documents come out near the
     * asked lengths */
    size_t span = fl.len < 40000 ? fl.len : 40000;
    double cpt = chars_per_token(E.m->vocab, fl.text + fl.len / 2 - span / 2, span), cpt_own[16];
    for (int t = 0; t < P.n_task; t++) cpt_own[t] = task_own_filler(P.tasks[t]) ? own_chars_per_token(&E, P.tasks[t]) : cpt;
    E.pg.t0 = E.pg.last = cli_now();
    E.pg.tty = isatty(2);
    E.pg.total = plan_cost(&E, &P, eo.n_predict);
    fprintf(stderr, "eval: %d tasks x %d lengths, %d configurations, filler %s, %d threads\n", P.n_task, P.n_ctx,
            P.n_cfg, fl.source, run_threads(E.r));
    for (int c = 0; c < P.n_ctx && !cli_interrupted; c++)
        for (int t = 0; t < P.n_task && !cli_interrupted; t++)
            for (int64_t k = 0; k < P.samples[c] && !cli_interrupted; k++)
                if (eval_sample(&E, &P, P.tasks[t], P.ctxs[c], k, cpt_own[t], &eo, &I, &it)) goto done;
    progress_show(&E.pg, "done", 1);
    fputc('\n', stderr);
    const unc_thresholds *thr = run_thresholds(E.r);
    printf("eval: %s, filler %s, thresholds %s\n\n", E.m->path, fl.source, thr->valid ? thr->source : "none");
    evalres_summary_md(stdout, &E.recs);
    rc = eo.out ? write_report(&E, eo.out, &eo, fl.source) : 0;
done:
    if (cli_interrupted) rc = cli_interrupt_status();
    if (E.out && files_close(E.out, csv_path, err, sizeof err)) {   /* rows lost to a full disk are a failure */
        cli_err("eval: %s", err);
        if (!rc) rc = 1;
    }
    E.out = NULL;
    close_runtime(&E);
    task_item_free(&it);
    free(I.ids);
    free(I.cont);
    filler_done(&fl);
    free(P.cfg);
    return rc;
}
