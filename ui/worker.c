/* worker.c - the engine thread of the TUI (see worker.h): a job queue of one, the event ring the
 * screen drains, and the published view. The conversation itself is the engine's session. */
#include "ui/worker.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "store/persist.h"
#include "ui/view.h"

enum { JOB_NONE, JOB_OPEN, JOB_ASK, JOB_RESUME, JOB_REGEN, JOB_SEEN, JOB_COMPARE, JOB_EDIT, JOB_POLICY, JOB_QUIT };
#define QCAP 4096

struct ui_worker {
    session *s;
    store *db;
    store_persist persist;
    char db_path[1024];          /* "" when nothing is saved */
    pthread_t th;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int job;
    char *arg;
    char policy_budget[32];      /* the budget a policy job switches with */
    int policy_budget_set;
    volatile sig_atomic_t cancel;
    uw_event q[QCAP];
    int qh, qt;
    uw_view view;
    double t_job;                /* when the running prefill or answer began */
    int64_t n_gen;
    uw_span *seen;               /* the last "what the model sees" spans, until taken */
    int n_seen;
    uw_compared cmp[8];          /* the last comparison, until taken */
    int n_cmp;
    samp_params pending_sp;      /* settings edited in the interface, applied when the next job starts */
    int64_t pending_n_predict;
    int have_pending;
    view_marks marks;            /* the page map as the current answer began */
    int running;                 /* the job being run (JOB_*) */
    volatile sig_atomic_t seen_live;   /* the "what the model sees" view is open: keep its spans fresh */
    double seen_at;              /* when they were last built */
    int keep_policy_once;        /* the next resume keeps the interface's policy */
    int done_posted;             /* the running job has posted its UW_DONE */
    char sep[600];               /* the separator an open draws once it is under way */
    int sep_pending;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void post(ui_worker *w, uw_kind k, const char *text, int64_t a, int64_t b)
{
    pthread_mutex_lock(&w->mu);
    int next = (w->qt + 1) % QCAP;
    if (next != w->qh) {   /* a full queue drops the event: the screen is behind by 4096 events */
        uw_event *e = &w->q[w->qt];
        e->kind = k;
        size_t len = text ? strlen(text) : 0;
        if (len >= sizeof e->text) {   /* cut long messages on a character boundary */
            len = sizeof e->text - 1;
            while (len > 0 && ((unsigned char)text[len] & 0xC0) == 0x80) len--;
        }
        if (len) memcpy(e->text, text, len);
        e->text[len] = 0;
        e->a = a;
        e->b = b;
        w->qt = next;
        if (k == UW_DONE) w->done_posted = 1;
    }
    pthread_mutex_unlock(&w->mu);
}

/* Copy the live figures for the UI (on the worker thread, between steps). */
static void publish(ui_worker *w)
{
    pthread_mutex_lock(&w->mu);
    view_fill(&w->view, w->s, &w->marks, !w->have_pending);
    if (w->view.phase == VIEW_ANSWER || w->view.phase == VIEW_COMPARE) w->view.answer_tokens = sess_answer_tokens(w->s);
    pthread_mutex_unlock(&w->mu);
}

/* The status bar's phase (under the mutex); its clock and count start again when it changes, or
 * when restart says so (the next column of a comparison). */
static void set_phase(ui_worker *w, int phase, int restart)
{
    pthread_mutex_lock(&w->mu);
    if (w->view.phase != phase || restart) {
        w->view.phase = phase;
        w->view.phase_start = now_s();
        w->view.answer_tokens = 0;
    }
    pthread_mutex_unlock(&w->mu);
}

static int answering_job(int job) { return job == JOB_ASK || job == JOB_REGEN || job == JOB_EDIT; }

/* The "what the model sees" spans built again for the open view (throttled while streaming). */
static void refresh_seen(ui_worker *w, int force)
{
    if (!w->seen_live || (!force && now_s() - w->seen_at < 0.5)) return;
    sess_span *sp;
    int n;
    if (sess_seen(w->s, &sp, &n)) return;
    w->seen_at = now_s();
    pthread_mutex_lock(&w->mu);
    sess_spans_free(w->seen, w->n_seen);
    w->seen = sp;
    w->n_seen = n;
    pthread_mutex_unlock(&w->mu);
    post(w, UW_SEEN, "", 0, 0);
}

/* ---- what the session reports */

static void on_progress(void *ud, int64_t done, int64_t total)
{
    ui_worker *w = ud;
    if (done >= total && answering_job(w->running)) {
        set_phase(w, VIEW_ANSWER, 0);   /* the question is in: the answer begins */
    } else if (w->view.phase != VIEW_PREFILL || done < w->view.done) {
        set_phase(w, VIEW_PREFILL, 1);
        w->t_job = now_s();
    }
    pthread_mutex_lock(&w->mu);
    w->view.done = done;
    w->view.total = total;
    pthread_mutex_unlock(&w->mu);
    /* tokens/s, time left and the KV memory so far, for the status bar */
    double el = now_s() - w->t_job, rate = el > 0 ? (double)done / el : 0;
    run_figures fg;
    run_get_figures(sess_run(w->s), &fg);
    char msg[160];
    snprintf(msg, sizeof msg, "prefill %lld/%lld tokens, %.0f tok/s, %.0f s left, KV %.1f MiB (Ctrl-C cancels)",
             (long long)done, (long long)total, rate, rate > 0 ? (double)(total - done) / rate : 0.0,
             (double)fg.kv_held / (1 << 20));
    post(w, UW_PROGRESS, msg, done, total);
    publish(w);
}

static void on_text(void *ud, const char *piece, size_t n)
{
    ui_worker *w = ud;
    char buf[512];
    snprintf(buf, sizeof buf, "%.*s", (int)(n < sizeof buf ? n : sizeof buf - 1), piece);
    post(w, UW_TEXT, buf, 0, 0);
    w->n_gen++;
    if (w->view.phase != VIEW_ANSWER) set_phase(w, VIEW_ANSWER, 0);
    publish(w);
    refresh_seen(w, 0);
}

static void on_column(void *ud, int i, int n, const char *policy, int64_t tokens)
{
    ui_worker *w = ud;
    set_phase(w, VIEW_COMPARE, tokens == 0);   /* a new column: its clock starts again */
    pthread_mutex_lock(&w->mu);
    w->view.column = i;
    w->view.n_columns = n;
    w->view.answer_tokens = tokens;
    (void)policy;
    pthread_mutex_unlock(&w->mu);
}

static void on_event(void *ud, const unc_event *e)
{
    char line[1024];
    unc_event_format(e, line, sizeof line);
    post(ud, UW_EVENT, line, e->step, e->regenerated);
}

/* The separator a document's open draws, posted with the open's first note (or its end): a refused
 * open draws none and leaves the conversation on the screen as it is. */
static void post_pending_separator(ui_worker *w)
{
    if (!w->sep_pending) return;
    w->sep_pending = 0;
    post(w, UW_SEPARATOR, w->sep, 0, 0);
}

static void on_note(void *ud, const char *msg)
{
    post_pending_separator(ud);
    post(ud, UW_INFO, msg, 0, 0);
}

static void on_past(void *ud, const char *role, const char *text)
{
    post(ud, !strcmp(role, "user") ? UW_PAST_USER : UW_PAST_ANSWER, text, 0, 0);
}

/* ---- jobs */

/* The line after an answer: its figures and where it was saved; then UW_DONE (a: stopped). */
static void answered(ui_worker *w, int rc)
{
    if (rc != SESS_OK && rc != SESS_ESAVE) {
        post(w, UW_ERROR, sess_error(w->s), 0, 0);
        return;
    }
    const sess_answer *a = sess_last_answer(w->s);
    run_figures fg;
    run_get_figures(sess_run(w->s), &fg);
    pthread_mutex_lock(&w->mu);
    w->view.tok_s = fg.decode_tok_s;
    if (fg.prefill_tok_s > 0) w->view.prefill_tok_s = fg.prefill_tok_s;
    pthread_mutex_unlock(&w->mu);
    publish(w);
    char note[700], msg[1200];
    if (rc == SESS_ESAVE)
        snprintf(note, sizeof note, "; %.600s", sess_error(w->s));
    else if (a->saved[0])
        snprintf(note, sizeof note, "; saved in %.600s", a->saved);
    else
        note[0] = 0;
    snprintf(msg, sizeof msg, "%lld tokens, %.1f tok/s, context %lld/%lld%s%s%s", (long long)a->gen.n_gen,
             w->view.tok_s, (long long)fg.positions, (long long)fg.n_ctx,
             a->gen.stop == GEN_STOP_INTERRUPT ? ", stopped" : a->gen.stop == GEN_STOP_CONTEXT ? ", context full" : "",
             a->gen.regenerated ? ", pages regenerated" : "", note);
    post(w, UW_DONE, msg, a->gen.stop == GEN_STOP_INTERRUPT, 0);
}

static void mark_map(ui_worker *w)
{
    view_mark(&w->marks, run_policies(sess_run(w->s)));
    w->n_gen = 0;
}

static void job_open(ui_worker *w, const char *path)
{
    const char *b = strrchr(path, '/');
    snprintf(w->sep, sizeof w->sep, "a new conversation: %.500s", b ? b + 1 : path);
    w->sep_pending = 1;
    /* under a prefill policy the document waits for the first question, as in `ask` (a note says so) */
    int rc = sess_open_document(w->s, path, NULL, NULL, SESS_DEFER_PREFILL_POLICY);
    if (rc == SESS_OK) post_pending_separator(w);
    w->sep_pending = 0;
    if (rc != SESS_OK) post(w, UW_ERROR, sess_error(w->s), 0, 0);
    publish(w);
}

static void job_ask(ui_worker *w, const char *question)
{
    mark_map(w);
    answered(w, sess_ask(w->s, question));
}

static void job_regen(ui_worker *w)
{
    if (sess_turns(w->s) == 0) {
        post(w, UW_ERROR, "nothing to regenerate yet", 0, 0);
        return;
    }
    post(w, UW_INFO, "another answer to the same question (a new branch):", 0, 0);
    mark_map(w);
    answered(w, sess_regenerate(w->s));
}

/* "N TEXT": ask TEXT in place of question N, as a new branch. */
static void job_edit(ui_worker *w, const char *arg)
{
    char *end;
    long k = strtol(arg, &end, 10);
    const char *text = end + (*end == ' ');
    if (end == arg || !*text) {
        post(w, UW_ERROR, "usage: /edit N NEW QUESTION (N: the question's number, 1 for the first)", 0, 0);
        return;
    }
    if (k < 1 || k > sess_turns(w->s)) {
        char err[160];
        snprintf(err, sizeof err, "there is no question %ld (this conversation has %lld)", k,
                 (long long)sess_turns(w->s));
        post(w, UW_ERROR, err, 0, 0);
        return;
    }
    post(w, UW_PAST_USER, text, 0, 0);
    mark_map(w);
    answered(w, sess_branch(w->s, (int)k, text));
}

/* "SPEC[,SPEC...] QUESTION": the question under each listed decode-time policy and the current one. */
static void job_compare(ui_worker *w, const char *arg)
{
    char specs[8][256], list[1024];
    const char *sp = strchr(arg, ' ');
    if (!sp || !sp[1]) {
        post(w, UW_ERROR, "usage: /compare SPEC[,SPEC...] QUESTION", 0, 0);
        return;
    }
    snprintf(list, sizeof list, "%.*s", (int)(sp - arg), arg);
    int n_spec = pol_split_list(list, specs, 7);
    if (n_spec < 1) {
        post(w, UW_ERROR, "compare up to 7 policies with the current one", 0, 0);
        return;
    }
    const char *sv[7];
    for (int i = 0; i < n_spec; i++) sv[i] = specs[i];
    pthread_mutex_lock(&w->mu);
    for (int i = 0; i < w->n_cmp; i++) free(w->cmp[i].text);
    w->n_cmp = 0;
    pthread_mutex_unlock(&w->mu);
    sess_compared out[8];
    int n_out = 0;
    int rc = sess_compare(w->s, sv, n_spec, sp + 1, out, &n_out);
    if (rc) post(w, UW_ERROR, sess_error(w->s), 0, 0);
    pthread_mutex_lock(&w->mu);
    for (int i = 0; i < n_out; i++) {
        uw_compared *c = &w->cmp[w->n_cmp++];
        snprintf(c->policy, sizeof c->policy, "%.250s", out[i].policy);
        snprintf(c->figures, sizeof c->figures,
                 "%lld tokens, %.1f s, %.1f pages/step, KV read %.2f MiB/step, %d uncertainty events",
                 (long long)out[i].n_tokens, out[i].seconds, out[i].pages_per_step,
                 out[i].kv_read_per_step / (1 << 20), out[i].events);
        c->text = out[i].text;   /* taken over */
    }
    pthread_mutex_unlock(&w->mu);
    publish(w);
}

static void job_seen(ui_worker *w)
{
    uw_span *sp;
    int n;
    if (sess_seen(w->s, &sp, &n)) {
        post(w, UW_ERROR, sess_error(w->s), 0, 0);
        return;
    }
    pthread_mutex_lock(&w->mu);
    sess_spans_free(w->seen, w->n_seen);
    w->seen = sp;
    w->n_seen = n;
    pthread_mutex_unlock(&w->mu);
}

static void job_policy(ui_worker *w, const char *spec)
{
    w->marks.ps = NULL;   /* the page map starts afresh under the new policies */
    int rc = sess_set_policy(w->s, spec, w->policy_budget_set ? w->policy_budget : NULL);
    if (rc) post(w, UW_ERROR, sess_error(w->s), 0, 0);
    publish(w);
}

/* A base model has no chat template: say what that means for its answers, and what to use for chat. */
static void base_model_note(ui_worker *w)
{
    post(w, UW_INFO, "This is a base model (no chat template): questions are asked as \"Question: ... Answer:\" "
                     "completions and an answer stops where the model begins its next \"Question:\". For chat, "
                     "pass an instruction-tuned GGUF with -m.", 0, 0);
}

/* No conversation yet: how to start, with a document to try (kvchat's own README, found beside the
 * program when it runs from its source tree, as `make run` does). */
static void welcome(ui_worker *w)
{
    char exe[1024], msg[1400];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    post(w, UW_INFO, "Welcome to kvchat: chat about a long document with a compressed KV cache. Open one with F6 "
                     "(the file picker) or /open PATH, then ask about it; F4 picks the compression policy, F1 lists "
                     "every key.", 0, 0);
    if (sess_format(w->s) == SESS_FORMAT_PLAIN) base_model_note(w);
    if (n <= 0) return;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return;
    snprintf(slash + 1, sizeof exe - (size_t)(slash + 1 - exe), "README.md");
    if (access(exe, R_OK) != 0) return;
    snprintf(msg, sizeof msg, "To try it: /open %s (kvchat's own manual), then ask e.g. \"How are snapshots kept?\"", exe);
    post(w, UW_INFO, msg, 0, 0);
}

static void job_resume(ui_worker *w, const char *key)
{
    if (!w->db) {
        if (*key)
            post(w, UW_ERROR, "no session database: nothing to resume", 0, 0);
        else
            welcome(w);
        return;
    }
    /* a session resumes under its own last policy, unless the command line named one for this launch */
    sess_resume_opts ro = { 0, !w->keep_policy_once, SESS_FORMAT_AUTO, NULL };
    w->keep_policy_once = 0;
    if (*key) {
        char sep[300];
        snprintf(sep, sizeof sep, "session %.200s", key);
        post(w, UW_SEPARATOR, sep, 0, 0);
    }
    int rc = sess_resume(w->s, key, &ro);
    if (rc == SESS_ENOTFOUND && !*key)
        welcome(w);
    else if (rc)
        post(w, UW_ERROR, sess_error(w->s), 0, 0);
    publish(w);
}

static void *engine_thread(void *arg)
{
    ui_worker *w = arg;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        while (w->job == JOB_NONE) pthread_cond_wait(&w->cv, &w->mu);
        int job = w->job;
        char *a = w->arg;
        w->arg = NULL;
        w->view.busy = job != JOB_QUIT;
        w->view.phase = VIEW_OTHER;
        w->view.phase_start = now_s();
        w->running = job;
        w->done_posted = 0;
        pthread_mutex_unlock(&w->mu);
        if (job == JOB_QUIT) {
            free(a);
            break;
        }
        w->cancel = 0;
        pthread_mutex_lock(&w->mu);
        if (w->have_pending) {   /* settings edited since the last job */
            sess_set_sampling(w->s, &w->pending_sp, w->pending_n_predict);
            w->have_pending = 0;
        }
        pthread_mutex_unlock(&w->mu);
        w->t_job = now_s();
        switch (job) {
        case JOB_OPEN:
            job_open(w, a);
            post(w, UW_DONE, "", 0, 1);
            break;
        case JOB_POLICY:
            job_policy(w, a ? a : "");
            post(w, UW_DONE, "", 0, 4);
            break;
        case JOB_EDIT:
            job_edit(w, a ? a : "");
            break;
        case JOB_COMPARE:
            job_compare(w, a ? a : "");
            post(w, UW_DONE, "", 0, 3);
            break;
        case JOB_SEEN:
            job_seen(w);
            post(w, UW_DONE, "", 0, 2);
            break;
        case JOB_REGEN:
            job_regen(w);
            break;
        case JOB_RESUME:
            job_resume(w, a ? a : "");
            post(w, UW_DONE, "", 0, 1);
            break;
        default:
            job_ask(w, a);
        }
        free(a);
        refresh_seen(w, 1);
        /* every job ends with a UW_DONE, also one that failed (what waits for it goes on) */
        if (!w->done_posted) post(w, UW_DONE, "", 0, 0);
        pthread_mutex_lock(&w->mu);
        w->job = JOB_NONE;
        w->view.busy = 0;
        w->view.phase = VIEW_IDLE;
        pthread_mutex_unlock(&w->mu);
    }
    return NULL;
}

ui_worker *uw_start(session *s, store *db, const char *db_path, char *err, size_t errlen)
{
    ui_worker *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    w->s = s;
    /* the conversation is saved as it goes; without a database it still works, unsaved */
    if (db) {
        store_persist_init(&w->persist, db);
        w->persist.hold = 1;   /* the open session is held: ask -c refuses it meanwhile (docs/store.md) */
        if (sess_attach_store(s, &w->persist.ops) == 0) {
            w->db = db;
            snprintf(w->db_path, sizeof w->db_path, "%s", db_path ? db_path : "");
        } else {
            snprintf(err, errlen, "%s", sess_error(s));
            free(w);
            return NULL;
        }
    }
    sess_callbacks cb = { w, on_progress, on_text, NULL, on_event, on_note, on_past, on_column };
    sess_set_callbacks(s, &cb, &w->cancel);
    if (sess_warning(s)[0]) {
        char msg[400];
        snprintf(msg, sizeof msg, "warning: %s", sess_warning(s));
        post(w, UW_INFO, msg, 0, 0);
    }
    if (sess_load_note(s)[0]) {
        char msg[400];
        snprintf(msg, sizeof msg, "note: %s", sess_load_note(s));
        post(w, UW_INFO, msg, 0, 0);
    }
    const model *m = run_model(sess_run(s));
    const char *b = strrchr(m->path, '/');
    snprintf(w->view.model, sizeof w->view.model, "%s", b ? b + 1 : m->path);
    run_device(sess_run(s), w->view.device, sizeof w->view.device);
    w->view.ctx_limit = run_n_ctx(sess_run(s));
    w->view.weights_mib = (double)m->weight_bytes / (1 << 20);
    const unc_thresholds *thr = run_thresholds(sess_run(s));
    w->view.thr_valid = thr->valid;
    w->view.thr_h = thr->h_mean;
    w->view.thr_v = thr->h_var;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    publish(w);
    if (pthread_create(&w->th, NULL, engine_thread, w) != 0) {
        snprintf(err, errlen, "cannot start the engine thread");
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        free(w);
        return NULL;
    }
    w->started = 1;
    return w;
}

static int submit(ui_worker *w, int job, const char *arg)
{
    char *a = arg ? strdup(arg) : NULL;
    pthread_mutex_lock(&w->mu);
    if (w->job != JOB_NONE && job != JOB_QUIT) {
        pthread_mutex_unlock(&w->mu);
        free(a);
        return -1;
    }
    free(w->arg);
    w->arg = a;
    w->job = job;
    if (job != JOB_QUIT) w->view.busy = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return 0;
}

void uw_stop(ui_worker *w)
{
    if (!w) return;
    if (w->started) {
        w->cancel = 1;
        /* wait for a running job to see the cancel, then ask the thread to leave */
        for (;;) {
            pthread_mutex_lock(&w->mu);
            int idle = w->job == JOB_NONE;
            if (idle) {
                w->job = JOB_QUIT;
                pthread_cond_signal(&w->cv);
            }
            pthread_mutex_unlock(&w->mu);
            if (idle) break;
            struct timespec ts = { 0, 10 * 1000 * 1000 };
            nanosleep(&ts, NULL);
        }
        pthread_join(w->th, NULL);
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
    }
    free(w->arg);
    view_marks_free(&w->marks);
    sess_spans_free(w->seen, w->n_seen);
    for (int i = 0; i < w->n_cmp; i++) free(w->cmp[i].text);
    sess_free(w->s);
    store_close(w->db);
    free(w);
}

int uw_open(ui_worker *w, const char *path) { return submit(w, JOB_OPEN, path); }
int uw_ask(ui_worker *w, const char *question) { return submit(w, JOB_ASK, question); }
int uw_resume(ui_worker *w, const char *key) { return submit(w, JOB_RESUME, key); }
int uw_regenerate(ui_worker *w) { return submit(w, JOB_REGEN, NULL); }
int uw_request_seen(ui_worker *w) { return submit(w, JOB_SEEN, NULL); }
int uw_compare(ui_worker *w, const char *arg) { return submit(w, JOB_COMPARE, arg); }
int uw_edit(ui_worker *w, const char *arg) { return submit(w, JOB_EDIT, arg); }

int uw_take_compared(ui_worker *w, uw_compared *out)
{
    pthread_mutex_lock(&w->mu);
    int n = w->n_cmp;
    memcpy(out, w->cmp, sizeof *out * (size_t)n);
    w->n_cmp = 0;   /* the texts now belong to the caller */
    pthread_mutex_unlock(&w->mu);
    return n;
}

uw_span *uw_take_seen(ui_worker *w, int *n)
{
    pthread_mutex_lock(&w->mu);
    uw_span *s = w->seen;
    *n = w->n_seen;
    w->seen = NULL;
    w->n_seen = 0;
    pthread_mutex_unlock(&w->mu);
    return s;
}

void uw_cancel(ui_worker *w) { w->cancel = 1; }

void uw_seen_live(ui_worker *w, int live)
{
    w->seen_live = live;   /* read by the worker between steps: a late flip costs one refresh */
}

void uw_keep_policy_once(ui_worker *w) { w->keep_policy_once = 1; }

int uw_check_policy(ui_worker *w, const char *spec, const char *budget, char *err, size_t errlen)
{
    pthread_mutex_lock(&w->mu);
    int busy = w->job != JOB_NONE;
    pthread_mutex_unlock(&w->mu);
    if (busy) {
        snprintf(err, errlen, "wait for the current job (or Ctrl-C) before switching policy");
        return -1;
    }
    /* the worker is idle and only this thread starts jobs: the session is this thread's to read */
    if (sess_check_policy(w->s, spec, budget)) {
        snprintf(err, errlen, "%s", sess_error(w->s));
        return -1;
    }
    return 0;
}

int uw_set_policy(ui_worker *w, const char *spec, const char *budget, char *err, size_t errlen)
{
    if (uw_check_policy(w, spec, budget, err, errlen)) return -1;
    /* the worker is idle: the budget is its to read when the job starts */
    w->policy_budget_set = budget != NULL;
    if (budget) snprintf(w->policy_budget, sizeof w->policy_budget, "%s", budget);
    if (submit(w, JOB_POLICY, spec)) {
        snprintf(err, errlen, "wait for the current job (or Ctrl-C) before switching policy");
        return -1;
    }
    return 0;
}

void uw_set_sampling(ui_worker *w, const samp_params *sp, int64_t n_predict)
{
    pthread_mutex_lock(&w->mu);
    w->pending_sp = *sp;
    w->pending_n_predict = n_predict;
    w->have_pending = 1;
    w->view.sp = *sp;   /* what the settings show from now on */
    w->view.n_predict = n_predict;
    pthread_mutex_unlock(&w->mu);
}

const char *uw_db_path(const ui_worker *w) { return w->db_path[0] ? w->db_path : NULL; }

int uw_poll(ui_worker *w, uw_event *ev)
{
    pthread_mutex_lock(&w->mu);
    int have = w->qh != w->qt;
    if (have) {
        *ev = w->q[w->qh];
        w->qh = (w->qh + 1) % QCAP;
    }
    pthread_mutex_unlock(&w->mu);
    return have;
}

void uw_get_view(ui_worker *w, uw_view *v)
{
    pthread_mutex_lock(&w->mu);
    *v = w->view;
    pthread_mutex_unlock(&w->mu);
}
