/* worker.c - the engine thread of the TUI (see worker.h). */
#include "ui/worker.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/chat.h"
#include "app/session.h"
#include "engine/snapshot.h"
#include "store/store.h"
#include "engine/tokenizer.h"

enum { JOB_NONE, JOB_OPEN, JOB_ASK, JOB_RESUME, JOB_REGEN, JOB_SEEN, JOB_COMPARE, JOB_EDIT, JOB_POLICY, JOB_QUIT };
#define QCAP 4096

struct ui_worker {
    cli_opts o;
    cli_runtime rt;
    samp *s;
    float *logits;
    int64_t n_predict;
    int chat;                    /* the model's chat template (1) or the plain Question/Answer form */
    int turns;                   /* questions answered about the current document */
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int job;
    char *arg;
    volatile sig_atomic_t cancel;
    uw_event q[QCAP];
    int qh, qt;
    uw_view view;
    double t_gen;
    int64_t n_gen;
    /* the sequence's token ids, the last one possibly sampled but not yet in the cache */
    int32_t *seq;
    int64_t n_seq, cap_seq;
    char *answer;            /* the current answer's text */
    size_t ans_len, ans_cap;
    /* the session it is saved to (db NULL: not saved) */
    store *db;
    int64_t sid, leaf, model_id;
    int64_t last_user;       /* the message the last answer replied to (a regeneration's parent) */
    char *last_q;            /* its text */
    int64_t ans_start, seq_ans;   /* where the last answer began: cache position, ids */
    uw_span *seen;           /* the last "what the model sees" spans, until taken */
    int n_seen;
    uw_compared cmp[8];      /* the last comparison, until taken */
    int n_cmp;
    /* where each turn asked here began, to branch from it (/edit): cache position, ids, sampler
     * state, the message it replied to */
#define MAX_TURNS 64
    int64_t turn_pos[MAX_TURNS], turn_seq[MAX_TURNS], turn_parent[MAX_TURNS];
    void *turn_samp[MAX_TURNS];
    int n_turns_here;        /* turns recorded (0 .. MAX_TURNS) */
    int turn_base;           /* the conversation's turn number of record 0 */
    int pending_record;      /* the turn being prepared is recorded at this index (-1: none) */
    char msha[65], doc_path[1024];
    char db_path[1024];      /* "" when nothing is saved */
    char budget[32];         /* the budget policies are created with ("" : their own) */
    samp_params pending_sp;  /* settings edited in the interface, applied when the next job starts */
    int64_t pending_n_predict;
    int have_pending;
    char err_sink[1024];     /* what cli_err said on this thread */
    /* the page map as the current answer began, to show that answer's attendance alone */
    int64_t *map_base, n_map_base, steps_base;
    const pol_set *map_ps;
};

/* Turns are written with Gemma's markers when the model's template is Gemma's; every other model
 * (and a template-less base model) gets the plain Question/Answer form. */
static int gemma_turns(const ui_worker *w) { return w->chat && chat_family_for(w->rt.m->gguf) == CHAT_GEMMA; }

static int seq_add(ui_worker *w, const int32_t *ids, int64_t n)
{
    if (w->n_seq + n > w->cap_seq) {
        int64_t nc = (w->n_seq + n) * 2;
        int32_t *ns = realloc(w->seq, sizeof(int32_t) * (size_t)nc);
        if (!ns) return -1;
        w->seq = ns;
        w->cap_seq = nc;
    }
    memcpy(w->seq + w->n_seq, ids, sizeof(int32_t) * (size_t)n);
    w->n_seq += n;
    return 0;
}

static void answer_add(ui_worker *w, const char *p, size_t n)
{
    if (w->ans_len + n + 1 > w->ans_cap) {
        size_t nc = (w->ans_len + n + 1) * 2;
        char *na = realloc(w->answer, nc);
        if (!na) return;
        w->answer = na;
        w->ans_cap = nc;
    }
    memcpy(w->answer + w->ans_len, p, n);
    w->ans_len += n;
    w->answer[w->ans_len] = 0;
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
    }
    pthread_mutex_unlock(&w->mu);
}

/* Copy the live figures for the UI (called on the worker thread between steps). */
static void publish(ui_worker *w)
{
    kv_stats ks;
    kv_get_stats(fwd_kv(w->rt.f), &ks);
    int64_t n;
    const int64_t *map = pol_set_page_map(w->rt.ps, &n);
    const float *h = unc_entropy(w->rt.mon), *v = unc_varentropy(w->rt.mon);
    int64_t nh = unc_count(w->rt.mon);
    int ne;
    const unc_event *ev = unc_events(w->rt.mon, &ne);
    pthread_mutex_lock(&w->mu);
    uw_view *o = &w->view;
    o->ctx_used = ks.positions;
    o->tokens_kept = ks.tokens_kept;
    o->tokens_full = ks.tokens_full;
    o->kv_held = ks.bytes_resident;
    o->kv_full = ks.bytes_full;
    o->kv_peak = ks.bytes_peak;
    o->rss_mib = cli_peak_rss_mib();
    if (w->rt.b->ops->memory) w->rt.b->ops->memory(w->rt.b, &o->gpu_held, &o->gpu_total);
    o->page_size = kv_page_size(fwd_kv(w->rt.f));
    int64_t total = (ks.positions + o->page_size - 1) / o->page_size;
    o->n_map = total < UW_MAP_MAX ? total : UW_MAP_MAX;
    int same = w->map_ps == w->rt.ps;   /* a new policy set starts its map afresh */
    for (int64_t i = 0; i < o->n_map; i++)
        o->map[i] = (i < n ? map[i] : 0) - (same && i < w->n_map_base ? w->map_base[i] : 0);
    pol_env env;
    fwd_policy_env(w->rt.f, &env);
    int64_t steps = pol_set_stats(w->rt.ps)->steps - (same ? w->steps_base : 0);
    o->map_full = steps * env.n_global * env.n_head_kv;
    memset(o->held, env.n_global > 0 ? 0 : 1, (size_t)o->n_map);
    if (env.n_global > 0) {
        const kv_cache *kv = fwd_kv(w->rt.f);
        for (int i = 0; i < kv_n_pages(kv, env.global[0], 0); i++) {
            const kv_page *p = kv_layer_page(kv, env.global[0], 0, i);
            for (int32_t t = 0; t < p->n; t++) {
                int64_t lp = p->pos[t] / o->page_size;
                if (p->pos[t] >= 0 && lp < o->n_map) o->held[lp] = 1;
            }
        }
    }
    int64_t from = nh > UW_HIST ? nh - UW_HIST : 0;
    o->n_hist = (int)(nh - from);
    for (int i = 0; i < o->n_hist; i++) {
        o->entropy[i] = h[from + i];
        o->varentropy[i] = v[from + i];
    }
    o->events = ne;
    o->regenerated = 0;
    for (int i = 0; i < ne; i++) o->regenerated += ev[i].regenerated;
    snprintf(o->policy, sizeof o->policy, "%s", pol_set_spec(w->rt.ps)->text);
    o->session_id = w->sid;
    if (!w->have_pending) {
        o->sp = *samp_get_params(w->s);
        o->n_predict = w->n_predict;
    }
    snprintf(o->budget, sizeof o->budget, "%s", w->budget);
    pthread_mutex_unlock(&w->mu);
}

static void on_progress(void *ud, int64_t done, int64_t total)
{
    ui_worker *w = ud;
    /* tokens/s, time left and the KV memory so far, for the status bar */
    double el = cli_now() - w->t_gen, rate = el > 0 ? (double)done / el : 0;
    kv_stats ks;
    kv_get_stats(fwd_kv(w->rt.f), &ks);
    char msg[160];
    snprintf(msg, sizeof msg, "prefill %lld/%lld tokens, %.0f tok/s, %.0f s left, KV %.1f MiB (Ctrl-C cancels)",
             (long long)done, (long long)total, rate, rate > 0 ? (double)(total - done) / rate : 0.0,
             (double)ks.bytes_resident / (1 << 20));
    post(w, UW_PROGRESS, msg, done, total);
    publish(w);
}

typedef struct stream {
    ui_worker *w;
    tok_stream ts;
} stream;

static void on_token(void *ud, int32_t id)
{
    stream *st = ud;
    char piece[512];
    size_t n = tok_stream_feed(&st->ts, id, piece, sizeof piece - 1);
    piece[n] = 0;
    if (n) post(st->w, UW_TEXT, piece, 0, 0);
    answer_add(st->w, piece, n);
    seq_add(st->w, &id, 1);
    st->w->n_gen++;
    publish(st->w);
}

static void on_event(void *ud, const unc_event *e)
{
    stream *st = ud;
    char line[1024];
    unc_event_format(e, line, sizeof line);
    post(st->w, UW_EVENT, line, e->step, e->regenerated);
}

/* Evaluate ids at the end of the sequence (a prefill: the prefill policy runs). */
static int eval(ui_worker *w, const int32_t *ids, size_t n, char *err, size_t errlen)
{
    if (fwd_pos(w->rt.f) + (int64_t)n + 1 > fwd_n_ctx(w->rt.f)) {
        snprintf(err, errlen, "%zu more tokens do not fit: %lld of the context's %lld are used", n,
                 (long long)fwd_pos(w->rt.f), (long long)fwd_n_ctx(w->rt.f));
        return -1;
    }
    for (size_t i = 0; i < n; i++) samp_accept(w->s, ids[i]);
    double t0 = cli_now();
    w->t_gen = t0;
    if (fwd_eval(w->rt.f, ids, (int64_t)n, w->logits, NULL, NULL, on_progress, w, &w->cancel, err, errlen))
        return -1;
    pthread_mutex_lock(&w->mu);
    w->view.prefill_tok_s = (double)n / (cli_now() - t0 + 1e-9);
    pthread_mutex_unlock(&w->mu);
    return 0;
}

/* A new session for the document just loaded (nothing happens without a database). */
static void start_session(ui_worker *w, const char *path, const char *text, size_t len, int64_t n_tokens)
{
    if (!w->db) return;
    char sha[65], msg[600];
    snap_sha256_bytes(text, len, sha);
    const char *b = strrchr(path, '/');
    int64_t doc_id;
    w->sid = w->leaf = 0;
    if (store_document_put(w->db, w->model_id, path, sha, b ? b + 1 : path, n_tokens, &doc_id) ||
        store_session_create(w->db, NULL, b ? b + 1 : path, w->model_id, doc_id, pol_set_spec(w->rt.ps)->text, NULL,
                             w->chat ? "chat" : "plain", &w->sid)) {
        snprintf(msg, sizeof msg, "this conversation is not saved: %s", store_error(w->db));
        post(w, UW_ERROR, msg, 0, 0);
        w->sid = 0;
        return;
    }
    snprintf(w->doc_path, sizeof w->doc_path, "%s", path);
}

static void job_open(ui_worker *w, const char *given)
{
    char err[1200], abs_path[1000];
    size_t len;
    /* the session keeps the absolute path, so it resumes from any directory */
    char *rp = realpath(given, NULL);
    snprintf(abs_path, sizeof abs_path, "%s", rp && strlen(rp) < sizeof abs_path ? rp : given);
    free(rp);
    const char *path = abs_path;
    char *text = cli_load_text(path, &len, err, sizeof err);
    if (!text) {
        post(w, UW_ERROR, err, 0, 0);
        return;
    }
    /* the document alone, the way its turn will continue: the plain form's "Question:" or the
     * rest of the chat template's user turn follows with the first question */
    size_t L = len + 64;
    char *prompt = malloc(L);
    int32_t *ids = NULL;
    size_t n = 0;
    int bad = !prompt;
    err[0] = 0;
    if (!bad) {
        int chat = gemma_turns(w);
        snprintf(prompt, L, chat ? "<bos><start_of_turn>user\n%s\n\n" : "%s\n\n", text);
        bad = tok_encode(w->rt.m->vocab, prompt, strlen(prompt), chat ? 0 : tok_add_bos(w->rt.m->vocab), chat, &ids, &n,
                         err, sizeof err) != 0;
    }
    free(prompt);
    if (bad) {
        post(w, UW_ERROR, err[0] ? err : "out of memory", 0, 0);
        free(ids);
        free(text);
        return;
    }
    /* say whether it fits before spending time on it: never cut a document silently */
    int64_t limit = fwd_n_ctx(w->rt.f);
    if ((int64_t)n + 64 > limit) {
        snprintf(err, sizeof err, "%s is %zu tokens; the context holds %lld (use --ctx or a shorter document)", path, n,
                 (long long)limit);
        post(w, UW_ERROR, err, 0, 0);
        free(ids);
        free(text);
        return;
    }
    uint64_t full = (uint64_t)n * (uint64_t)w->rt.m->hp.n_layer * (uint64_t)w->rt.m->hp.n_head_kv *
                    (uint64_t)w->rt.m->hp.head_dim * 4u;
    snprintf(err, sizeof err, "%.700s: %zu tokens of %lld, a full cache would need %.1f MiB; prefilling under %.250s",
             path, n, (long long)limit, (double)full / (1 << 20), pol_set_spec(w->rt.ps)->text);
    post(w, UW_INFO, err, 0, 0);
    fwd_rewind(w->rt.f, 0);
    samp_reset(w->s);
    w->turns = 0;
    w->turn_base = 0;
    w->n_turns_here = 0;
    w->n_seq = 0;
    pthread_mutex_lock(&w->mu);
    const char *b = strrchr(path, '/');
    snprintf(w->view.doc, sizeof w->view.doc, "%.250s", b ? b + 1 : path);
    w->view.doc_tokens = (int64_t)n;
    w->view.have_doc = 0;
    pthread_mutex_unlock(&w->mu);
    pol_set_probe_is_question(w->rt.ps, 0);   /* no question yet: the probe is the document's end */
    if (seq_add(w, ids, (int64_t)n) || eval(w, ids, n, err, sizeof err)) {
        post(w, UW_ERROR, w->cancel ? "prefill cancelled; the document is not loaded" : err, 0, 0);
        fwd_rewind(w->rt.f, 0);
        w->n_seq = 0;
    } else {
        pthread_mutex_lock(&w->mu);
        w->view.have_doc = 1;
        pthread_mutex_unlock(&w->mu);
        fwd_set_floor(w->rt.f, fwd_pos(w->rt.f));
        char d[1024];
        pol_set_describe(w->rt.ps, d, sizeof d);
        post(w, UW_INFO, d[0] ? d : "document loaded", 0, 0);
        start_session(w, path, text, len, (int64_t)n);
    }
    free(ids);
    free(text);
    publish(w);
}

/* A snapshot of the sequence as it is, filed under message msg and the current prefill policy.
 * 0 (*len: its size), or -1 with a message. */
static int save_snapshot(ui_worker *w, int64_t msg, size_t *len, char *err, size_t errlen)
{
    char key[256];
    snap_identity id;
    snap_identity_of(w->rt.f, w->msha, &id);
    void *data;
    int64_t snap_id;
    sess_prefill_key(pol_set_spec(w->rt.ps), key, sizeof key);
    if (snap_save(w->rt.f, w->s, &id, w->seq, w->n_seq, &data, len, err, errlen)) return -1;
    int bad = store_snapshot_put(w->db, w->sid, msg, key, w->n_seq, data, *len, &snap_id);
    free(data);
    if (bad) snprintf(err, errlen, "%s", store_error(w->db));
    return bad ? -1 : 0;
}

/* Restore the sequence from snapshot bytes, with a cache of the snapshot's page size. 0, or -1 with
 * a message (nothing changed then). */
static int restore_snapshot(ui_worker *w, const void *data, size_t len, int64_t *n_tokens, char *err, size_t errlen)
{
    int ps = snap_page_size(data, len);
    if (ps > 0 && ps != kv_page_size(fwd_kv(w->rt.f)) && cli_reopen_fwd(&w->rt, &w->o, ps)) {
        snprintf(err, errlen, "cannot open a cache with the snapshot's page size: %s", w->err_sink);
        return -1;
    }
    snap_identity id;
    snap_identity_of(w->rt.f, w->msha, &id);
    int32_t *ids = NULL;
    int64_t n = 0;
    if (snap_restore(w->rt.f, w->s, data, len, &id, &ids, &n, err, errlen)) return -1;
    w->n_seq = 0;
    int bad = seq_add(w, ids, n);
    free(ids);
    if (bad) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    *n_tokens = n;
    return 0;
}

/* The turn goes into the session: both messages, the events, a snapshot of the sequence. */
static void save_turn(ui_worker *w, const char *question, const gen_result *gr, double dt, int regen, char *note,
                      size_t cap)
{
    note[0] = 0;
    if (!w->db || !w->sid) return;
    char mj[600], err[1024];
    kv_stats ks;
    kv_get_stats(fwd_kv(w->rt.f), &ks);
    snprintf(mj, sizeof mj,
             "{\"policy\": \"%s\", \"answer_tokens\": %lld, \"decode_s\": %.3f, \"kv_bytes\": %llu, \"events\": %d, "
             "\"regenerated\": %d}",
             pol_set_spec(w->rt.ps)->text, (long long)gr->n_gen, dt, (unsigned long long)ks.bytes_resident, gr->events,
             gr->regenerated);
    int64_t um, am;
    int n_ev;
    const unc_event *ev = unc_events(w->rt.mon, &n_ev);
    if (regen) {
        um = w->last_user;   /* another answer to the same question: a new branch */
    } else if (store_message_add(w->db, w->sid, w->leaf, "user", question, pol_set_spec(w->rt.ps)->text, NULL, &um)) {
        snprintf(note, cap, "; not saved: %s", store_error(w->db));
        return;
    }
    w->last_user = um;
    if (
        store_message_add(w->db, w->sid, um, "assistant", w->answer ? w->answer : "", pol_set_spec(w->rt.ps)->text, mj,
                          &am) ||
        store_events_put(w->db, am, ev, n_ev)) {
        snprintf(note, cap, "; not saved: %s", store_error(w->db));
        return;
    }
    w->leaf = am;
    size_t len;
    if (save_snapshot(w, am, &len, err, sizeof err))
        snprintf(note, cap, "; saved without a snapshot: %.300s", err);
    else
        snprintf(note, cap, "; saved in session %lld (snapshot %.1f MiB)", (long long)w->sid, (double)len / (1 << 20));
}

/* Generate the answer (the prompt is evaluated: logits are ready) and save the turn. */
static void answer_and_save(ui_worker *w, const char *question, int32_t prev, int regen)
{
    char err[1200];
    w->ans_len = 0;
    if (w->answer) w->answer[0] = 0;
    stream st = { w, { 0 } };
    tok_stream_init(&st.ts, w->rt.m->vocab);
    gen_opts go = { w->n_predict, prev, &w->rt.thr, w->rt.backtrack, samp_temperature(w->s), 1 };
    gen_callbacks cb = { &st, on_token, NULL, on_event };
    gen_result gr;
    /* the side panel's page map shows this answer's attendance */
    int64_t nm;
    const int64_t *m0 = pol_set_page_map(w->rt.ps, &nm);
    int64_t *nb = realloc(w->map_base, sizeof *nb * (size_t)(nm > 0 ? nm : 1));
    if (nb) {
        if (nm) memcpy(nb, m0, sizeof *nb * (size_t)nm);
        w->map_base = nb;
        w->n_map_base = nm;
        w->steps_base = pol_set_stats(w->rt.ps)->steps;
        w->map_ps = w->rt.ps;
    }
    w->n_gen = 0;
    w->ans_start = fwd_pos(w->rt.f);
    w->seq_ans = w->n_seq;
    fwd_set_floor(w->rt.f, w->ans_start - 1);   /* a regeneration rewinds here exactly */
    double t0 = cli_now();
    if (gen_answer(w->rt.f, w->s, w->rt.m->vocab, w->rt.mon, w->logits, w->rt.m->hp.n_vocab, &go, &cb, &w->cancel, &gr,
                   err, sizeof err)) {
        post(w, UW_ERROR, err, 0, 0);
        return;
    }
    char piece[512];
    size_t k = tok_stream_flush(&st.ts, piece, sizeof piece - 1);
    piece[k] = 0;
    if (k) post(w, UW_TEXT, piece, 0, 0);
    w->turns++;
    double dt = cli_now() - t0;
    char note[700];
    if (!regen && w->pending_record == w->n_turns_here && w->pending_record >= 0) w->n_turns_here++;
    w->pending_record = -1;
    save_turn(w, question, &gr, dt, regen, note, sizeof note);
    if (question != w->last_q) {
        free(w->last_q);
        w->last_q = strdup(question);
    }
    pthread_mutex_lock(&w->mu);
    w->view.tok_s = gr.n_decoded > 0 ? (double)gr.n_decoded / dt : 0;
    pthread_mutex_unlock(&w->mu);
    publish(w);
    snprintf(err, sizeof err, "%lld tokens, %.1f tok/s, context %lld/%lld%s%s%s", (long long)gr.n_gen, w->view.tok_s,
             (long long)fwd_pos(w->rt.f), (long long)fwd_n_ctx(w->rt.f),
             gr.stop == GEN_STOP_INTERRUPT ? ", stopped" : gr.stop == GEN_STOP_CONTEXT ? ", context full" : "",
             gr.regenerated ? ", pages regenerated" : "", note);
    post(w, UW_DONE, err, gr.stop == GEN_STOP_INTERRUPT, 0);
}

/* The next turn's tokens join the sequence and what the cache lacks is evaluated; *prev gets the
 * last evaluated token. 0, or -1 after posting the error. */
static int prepare_turn(ui_worker *w, const char *question, int32_t *prev)
{
    char err[1200];
    int32_t *ids = NULL;
    size_t n = 0;
    int chat = gemma_turns(w), bad;
    if (w->turns > 0) {
        bad = sess_continue_tokens(&w->rt, chat, question, &ids, &n, err, sizeof err);
    } else {
        /* the first question completes the document's turn (or, with no document, is the turn) */
        size_t L = strlen(question) + 64;
        char *text = malloc(L);
        if (text && chat)
            snprintf(text, L, w->view.have_doc ? "%s<end_of_turn>\n<start_of_turn>model\n"
                                               : "<bos><start_of_turn>user\n%s<end_of_turn>\n<start_of_turn>model\n",
                     question);
        else if (text)
            snprintf(text, L, "Question: %s\nAnswer:", question);
        int add_bos = fwd_pos(w->rt.f) == 0 && !chat ? tok_add_bos(w->rt.m->vocab) : 0;
        snprintf(err, sizeof err, "out of memory");
        bad = !text || tok_encode(w->rt.m->vocab, text, strlen(text), add_bos, chat, &ids, &n, err, sizeof err);
        free(text);
    }
    if (bad) {
        free(ids);
        post(w, UW_ERROR, err, 0, 0);
        return -1;
    }
    /* the turn joins the sequence; what the cache lacks (the last answer's final token, sampled but
     * never evaluated, then the turn) is evaluated */
    int64_t from = fwd_pos(w->rt.f);
    /* remember where this turn starts (for /edit); a full record table stops recording */
    w->pending_record = -1;
    if (w->n_turns_here < MAX_TURNS && (w->turn_samp[w->n_turns_here] || (w->turn_samp[w->n_turns_here] = malloc(samp_state_size())))) {
        int r = w->n_turns_here;
        w->turn_pos[r] = from;
        w->turn_seq[r] = w->n_seq;
        w->turn_parent[r] = w->leaf;
        samp_save_state(w->s, w->turn_samp[r]);
        w->pending_record = r;
    }
    if (seq_add(w, ids, (int64_t)n)) {
        free(ids);
        post(w, UW_ERROR, "out of memory", 0, 0);
        return -1;
    }
    free(ids);
    n = (size_t)(w->n_seq - from);
    ids = malloc(sizeof(int32_t) * (n > 0 ? n : 1));
    if (!ids) {
        post(w, UW_ERROR, "out of memory", 0, 0);
        return -1;
    }
    memcpy(ids, w->seq + from, sizeof(int32_t) * n);
    pol_set_probe_is_question(w->rt.ps, 1);
    if (eval(w, ids, n, err, sizeof err)) {
        post(w, UW_ERROR, w->cancel ? "cancelled" : err, 0, 0);
        free(ids);
        w->n_seq = fwd_pos(w->rt.f);   /* the turn did not happen */
        return -1;
    }
    *prev = ids[n - 1];
    free(ids);
    return 0;
}

static void job_ask(ui_worker *w, const char *question)
{
    int32_t prev;
    if (prepare_turn(w, question, &prev) == 0) answer_and_save(w, question, prev, 0);
}

/* collects one compared answer's text */
static void on_cmp_token(void *ud, int32_t id)
{
    stream *st = ud;
    char piece[512];
    size_t n = tok_stream_feed(&st->ts, id, piece, sizeof piece - 1);
    answer_add(st->w, piece, n);
    publish(st->w);
}

/* The same question under several decode policies, each from the same cache: a side query that
 * leaves the conversation as it was. arg: "SPEC[,SPEC...] QUESTION". */
static void job_compare(ui_worker *w, const char *arg)
{
    char specs[8][256], list[1024], err[1200], key[256], keep[256];
    const char *sp = strchr(arg, ' ');
    if (!sp || !sp[1]) {
        post(w, UW_ERROR, "usage: /compare SPEC[,SPEC...] QUESTION", 0, 0);
        return;
    }
    snprintf(list, sizeof list, "%.*s", (int)(sp - arg), arg);
    const char *question = sp + 1;
    int n_spec = cli_split_policies(list, specs + 1, 7);
    if (n_spec < 1) {
        post(w, UW_ERROR, "compare up to 7 policies with the current one", 0, 0);
        return;
    }
    snprintf(keep, sizeof keep, "%s", pol_set_spec(w->rt.ps)->text);
    snprintf(specs[0], sizeof specs[0], "%s", keep);
    n_spec++;
    /* each compared policy keeps the cache's prefill policy: only the decode-time part varies; a
     * prefill policy that also acts while decoding would change the cache under the comparison */
    sess_prefill_key(pol_set_spec(w->rt.ps), key, sizeof key);
    if (!strncmp(key, "h2o", 3) || !strncmp(key, "chelsea", 7)) {
        post(w, UW_ERROR, "compare needs a cache that decoding leaves alone: not under h2o or chelsea", 0, 0);
        return;
    }
    for (int i = 1; i < n_spec; i++) {
        pol_spec ps;
        if (pol_parse(&ps, specs[i], NULL, err, sizeof err)) {
            post(w, UW_ERROR, err, 0, 0);
            return;
        }
        for (int k = 0; k < ps.n; k++)
            if (ps.ops[k]->stage == POL_STAGE_PREFILL) {
                post(w, UW_ERROR, "compare decode-time policies (chess, quest, sentkv, streaming, full) on the cache as it is",
                     0, 0);
                return;
            }
        if (strcmp(key, "full") != 0) {
            char comb[256];
            snprintf(comb, sizeof comb, "%.120s+%.120s", key, specs[i]);
            snprintf(specs[i], sizeof specs[i], "%s", comb);
        }
    }
    int64_t turn_start = fwd_pos(w->rt.f), seq0 = w->n_seq;
    int32_t prev;
    void *s0 = malloc(samp_state_size());
    if (!s0) return;
    samp_save_state(w->s, s0);
    if (prepare_turn(w, question, &prev)) {
        free(s0);
        return;
    }
    int64_t p_ans = fwd_pos(w->rt.f);
    size_t nv = (size_t)w->rt.m->hp.n_vocab;
    float *l0 = malloc(sizeof(float) * nv);
    void *s1 = malloc(samp_state_size());
    if (!l0 || !s1) {
        free(l0);
        free(s1);
        free(s0);
        return;
    }
    memcpy(l0, w->logits, sizeof(float) * nv);
    samp_save_state(w->s, s1);
    fwd_set_floor(w->rt.f, p_ans);
    pthread_mutex_lock(&w->mu);
    for (int i = 0; i < w->n_cmp; i++) free(w->cmp[i].text);
    w->n_cmp = 0;
    pthread_mutex_unlock(&w->mu);
    pol_set *orig = w->rt.ps;   /* the conversation's own policies stay untouched */
    pol_env env;
    fwd_policy_env(w->rt.f, &env);
    for (int i = 0; i < n_spec && !w->cancel; i++) {
        pol_spec spec;
        pol_set *ps_i = pol_parse(&spec, specs[i], NULL, err, sizeof err) ? NULL : pol_set_create(&spec, &env, err, sizeof err);
        if (!ps_i) {
            post(w, UW_ERROR, err, 0, 0);
            break;
        }
        fwd_set_policy(w->rt.f, ps_i);
        if (fwd_rewind(w->rt.f, p_ans) != p_ans) {
            fwd_set_policy(w->rt.f, orig);
            pol_set_free(ps_i);
            break;
        }
        memcpy(w->logits, l0, sizeof(float) * nv);
        samp_load_state(w->s, s1);
        w->ans_len = 0;
        if (w->answer) w->answer[0] = 0;
        stream st = { w, { 0 } };
        tok_stream_init(&st.ts, w->rt.m->vocab);
        gen_opts go = { w->n_predict, prev, &w->rt.thr, 0, samp_temperature(w->s), w->rt.thr.valid };
        gen_callbacks cb = { &st, on_cmp_token, NULL, NULL };
        gen_result gr;
        double t0 = cli_now();
        if (gen_answer(w->rt.f, w->s, w->rt.m->vocab, w->rt.mon, w->logits, (int32_t)nv, &go, &cb, &w->cancel, &gr, err,
                       sizeof err)) {
            fwd_set_policy(w->rt.f, orig);
            pol_set_free(ps_i);
            break;
        }
        char piece[512];
        size_t k = tok_stream_flush(&st.ts, piece, sizeof piece - 1);
        answer_add(w, piece, k);
        double dt = cli_now() - t0;
        const pol_step_stats *ps = pol_set_stats(ps_i);
        double denom = (double)ps->steps * env.n_global * env.n_head_kv;
        pthread_mutex_lock(&w->mu);
        uw_compared *c = &w->cmp[w->n_cmp++];
        snprintf(c->policy, sizeof c->policy, "%.250s", specs[i]);
        snprintf(c->figures, sizeof c->figures,
                 "%lld tokens, %.1f s, %.1f pages/step, KV read %.2f MiB/step, %d uncertainty events",
                 (long long)gr.n_gen, dt, denom > 0 ? (double)ps->pages_sum / denom : 0.0,
                 ps->steps ? (double)ps->bytes_touched_total / (double)ps->steps / (1 << 20) : 0.0, gr.events);
        c->text = strdup(w->answer ? w->answer : "");
        pthread_mutex_unlock(&w->mu);
        fwd_set_policy(w->rt.f, orig);
        pol_set_free(ps_i);
    }
    /* the conversation goes on as before the comparison (replaying the sequence if the
     * sliding-window layers no longer hold what the turn's start needs) */
    fwd_set_policy(w->rt.f, orig);
    int64_t r = fwd_rewind(w->rt.f, turn_start);
    w->n_seq = seq0;
    if (r < turn_start && eval(w, w->seq + r, (size_t)(turn_start - r), err, sizeof err)) post(w, UW_ERROR, err, 0, 0);
    fwd_set_floor(w->rt.f, w->turns > 0 ? w->ans_start - 1 : turn_start);   /* where /regen rewinds to */
    samp_load_state(w->s, s0);
    free(l0);
    free(s0);
    free(s1);
    publish(w);
}

/* Another answer to the last question: rewind to before the answer, evaluate the question's last
 * token again, generate, and save it as a sibling branch. */
static void job_regen(ui_worker *w)
{
    char err[1200];
    if (w->turns == 0 || !w->last_q || w->ans_start < 1) {
        post(w, UW_ERROR, "nothing to regenerate yet", 0, 0);
        return;
    }
    int64_t target = w->ans_start - 1;
    int64_t r = fwd_rewind(w->rt.f, target);
    w->n_seq = w->seq_ans;
    if (r < target && eval(w, w->seq + r, (size_t)(target - r), err, sizeof err)) {   /* replay what was lost */
        post(w, UW_ERROR, err, 0, 0);
        return;
    }
    int32_t prev = w->seq[target];
    if (eval(w, &prev, 1, err, sizeof err)) {
        post(w, UW_ERROR, err, 0, 0);
        return;
    }
    w->turns--;
    post(w, UW_INFO, "another answer to the same question (a new branch):", 0, 0);
    answer_and_save(w, w->last_q, prev, 1);
}

/* The sequence's text in spans of equal cache state (first global layer, KV head 0). */
static void job_seen(ui_worker *w)
{
    int64_t n = w->n_seq;
    char *state = calloc((size_t)(n > 0 ? n : 1), 1);
    if (!state) return;
    pol_env env;
    fwd_policy_env(w->rt.f, &env);
    if (env.n_global > 0) {
        int il = env.global[0];
        const kv_cache *kv = fwd_kv(w->rt.f);
        for (int i = 0; i < kv_n_pages(kv, il, 0); i++) {
            const kv_page *p = kv_layer_page(kv, il, 0, i);
            for (int32_t t = 0; t < p->n; t++)
                if (p->pos[t] >= 0 && p->pos[t] < n) state[p->pos[t]] = 1;
        }
        int nl;
        const int *last = pol_set_last_pages(w->rt.ps, &nl);
        for (int k = 0; k < nl; k++) {
            if (last[k] >= kv_n_pages(kv, il, 0)) continue;
            const kv_page *p = kv_layer_page(kv, il, 0, last[k]);
            for (int32_t t = 0; t < p->n; t++)
                if (p->pos[t] >= 0 && p->pos[t] < n) state[p->pos[t]] = 2;
        }
    } else {
        memset(state, 1, (size_t)n);
    }
    uw_span *sp = NULL;
    int ns = 0, cap = 0;
    tok_stream ts;
    tok_stream_init(&ts, w->rt.m->vocab);
    char piece[512];
    for (int64_t i = 0; i < n; i++) {
        size_t k = tok_stream_feed(&ts, w->seq[i], piece, sizeof piece - 1);
        if (i == n - 1) k += tok_stream_flush(&ts, piece + k, sizeof piece - 1 - k);
        if (k == 0) continue;
        piece[k] = 0;
        if (ns == 0 || sp[ns - 1].state != state[i]) {
            if (ns == cap) {
                cap = cap ? cap * 2 : 64;
                uw_span *nsp = realloc(sp, sizeof *nsp * (size_t)cap);
                if (!nsp) break;
                sp = nsp;
            }
            sp[ns].state = state[i];
            sp[ns].text = strdup(piece);
            ns++;
        } else {
            size_t a = strlen(sp[ns - 1].text);
            char *nt = realloc(sp[ns - 1].text, a + k + 1);
            if (!nt) break;
            memcpy(nt + a, piece, k + 1);
            sp[ns - 1].text = nt;
        }
    }
    free(state);
    pthread_mutex_lock(&w->mu);
    for (int i = 0; i < w->n_seen; i++) free(w->seen[i].text);
    free(w->seen);
    w->seen = sp;
    w->n_seen = ns;
    pthread_mutex_unlock(&w->mu);
}

/* The cache is empty again and no document is loaded (a rebuild that failed half way). */
static void drop_document(ui_worker *w)
{
    fwd_rewind(w->rt.f, 0);
    w->n_seq = 0;
    pthread_mutex_lock(&w->mu);
    w->view.have_doc = 0;
    pthread_mutex_unlock(&w->mu);
}

/* Question k (asked before this window, so its start was not recorded) asked as text instead: the
 * document and the conversation before it come from the session and are prefilled again. */
static void edit_from_store(ui_worker *w, int k, const char *text)
{
    char err[1200], msg[1400];
    if (!w->db || !w->sid) {
        post(w, UW_ERROR, "this conversation is not saved: only questions asked in this window can be edited", 0, 0);
        return;
    }
    store_message *path = NULL;
    int n_path = 0;
    if (!w->leaf || store_message_path(w->db, w->leaf, &path, &n_path)) {
        post(w, UW_ERROR, w->leaf ? store_error(w->db) : "nothing saved yet", 0, 0);
        return;
    }
    int qi = 2 * (k - 1);
    if (qi >= n_path || strcmp(path[qi].role, "user") != 0) {
        snprintf(err, sizeof err, "question %d is not in the saved conversation", k);
        post(w, UW_ERROR, err, 0, 0);
        store_messages_free(path, n_path);
        return;
    }
    size_t dl, n = 0;
    int32_t *ids = NULL;
    char *doc = cli_load_text(w->doc_path, &dl, err, sizeof err);
    if (!doc || sess_full_tokens(&w->rt, w->chat, doc, path, qi, text, &ids, &n, err, sizeof err)) {
        free(doc);
        post(w, UW_ERROR, err, 0, 0);
        store_messages_free(path, n_path);
        return;
    }
    free(doc);
    int64_t parent = path[qi].parent;
    store_messages_free(path, n_path);
    snprintf(msg, sizeof msg, "question %d edited: a new branch (the old one stays in the session); prefilling the "
                              "document and the %d turns before it (%zu tokens)",
             k, k - 1, n);
    post(w, UW_INFO, msg, 0, 0);
    post(w, UW_PAST_USER, text, 0, 0);
    fwd_rewind(w->rt.f, 0);
    samp_reset(w->s);
    w->n_seq = 0;
    pol_set_probe_is_question(w->rt.ps, 1);
    if (seq_add(w, ids, (int64_t)n) || eval(w, ids, n, err, sizeof err)) {
        post(w, UW_ERROR, w->cancel ? "cancelled; /resume continues the session" : err, 0, 0);
        free(ids);
        drop_document(w);
        return;
    }
    int32_t prev = ids[n - 1];
    free(ids);
    w->leaf = parent;
    w->turns = k - 1;
    w->turn_base = k - 1;
    w->n_turns_here = 0;
    w->pending_record = -1;
    answer_and_save(w, text, prev, 0);
}

/* "N TEXT": ask TEXT in place of question N of this conversation, as a new branch from where that
 * question was asked (the old branch stays in the session). */
static void job_edit(ui_worker *w, const char *arg)
{
    char err[1200];
    char *end;
    long k = strtol(arg, &end, 10);
    const char *text = end + (*end == ' ');
    if (end == arg || !*text) {
        post(w, UW_ERROR, "usage: /edit N NEW QUESTION (N: the question's number, 1 for the first)", 0, 0);
        return;
    }
    int r = (int)k - 1 - w->turn_base;
    if (k < 1 || k > w->turns) {
        snprintf(err, sizeof err, "there is no question %ld (this conversation has %d)", k, w->turns);
        post(w, UW_ERROR, err, 0, 0);
        return;
    }
    if (r < 0 || r >= w->n_turns_here) {
        edit_from_store(w, (int)k, text);
        return;
    }
    int64_t pos = w->turn_pos[r];
    int64_t got = fwd_rewind(w->rt.f, pos);
    w->n_seq = w->turn_seq[r];
    if (got < pos && eval(w, w->seq + got, (size_t)(pos - got), err, sizeof err)) {   /* replay what was lost */
        post(w, UW_ERROR, err, 0, 0);
        return;
    }
    samp_load_state(w->s, w->turn_samp[r]);
    w->leaf = w->turn_parent[r];
    w->turns = w->turn_base + r;
    w->n_turns_here = r;   /* later records belong to the old branch */
    snprintf(err, sizeof err, "question %ld edited: a new branch (the old one stays in the session)", k);
    post(w, UW_INFO, err, 0, 0);
    post(w, UW_PAST_USER, text, 0, 0);
    int32_t prev;
    if (prepare_turn(w, text, &prev) == 0) answer_and_save(w, text, prev, 0);
}

/* Regenerations per answer: --backtrack, else 2 for a policy with a selection it can rebuild. */
static void set_backtrack(ui_worker *w)
{
    w->rt.backtrack = w->o.backtrack >= 0 ? w->o.backtrack : pol_set_can_reselect(w->rt.ps) ? 2 : 0;
}

/* Switch to spec (with the worker's budget). With a document loaded and another prefill policy, the
 * cache is rebuilt: from the session's snapshot of this point under the new policy when there is
 * one, else by prefilling the sequence again; a failure or Ctrl-C goes back to the old policy and
 * its cache. */
static void job_policy(ui_worker *w, const char *spec)
{
    char err[1200], msg[2400], oldkey[256], newkey[256], old[256];
    pol_spec parsed;
    w->map_ps = NULL;   /* the page map starts afresh under the new policies */
    if (pol_parse(&parsed, spec, w->budget[0] ? w->budget : NULL, err, sizeof err)) {
        post(w, UW_ERROR, err, 0, 0);
        return;
    }
    sess_prefill_key(pol_set_spec(w->rt.ps), oldkey, sizeof oldkey);
    sess_prefill_key(&parsed, newkey, sizeof newkey);
    snprintf(old, sizeof old, "%s", pol_set_spec(w->rt.ps)->text);
    int64_t P = fwd_pos(w->rt.f);
    if (!w->view.have_doc || P == 0 || !strcmp(oldkey, newkey)) {
        /* the cache stays as it is: a decode-time policy reads it from the next answer on */
        if (cli_set_policy(&w->rt, spec, w->budget)) {
            post(w, UW_ERROR, w->err_sink, 0, 0);
            return;
        }
        set_backtrack(w);
        snprintf(msg, sizeof msg, "policy %s%s%s: from the next answer on%s", pol_set_spec(w->rt.ps)->text,
                 w->budget[0] ? ", budget " : "", w->budget,
                 w->view.have_doc ? "" : " (a prefill policy acts when a document is opened)");
        post(w, UW_INFO, msg, 0, 0);
        return;
    }
    /* keep the current state to come back to */
    snap_identity id;
    snap_identity_of(w->rt.f, w->msha, &id);
    void *keep = NULL, *data = NULL;
    size_t keep_len = 0, len = 0;
    if (snap_save(w->rt.f, w->s, &id, w->seq, w->n_seq, &keep, &keep_len, err, sizeof err)) {
        post(w, UW_ERROR, err, 0, 0);
        return;
    }
    int64_t n_seq = w->n_seq;
    void *s0 = malloc(samp_state_size());
    if (!s0 || cli_set_policy(&w->rt, spec, w->budget)) {
        post(w, UW_ERROR, s0 ? w->err_sink : "out of memory", 0, 0);
        free(s0);
        free(keep);
        return;
    }
    samp_save_state(w->s, s0);
    double t0 = cli_now();
    int got = w->db && w->leaf ? store_snapshot_get(w->db, w->leaf, newkey, &data, &len) : 1, ok = 0;
    int64_t n = 0;
    if (got == 0 && restore_snapshot(w, data, len, &n, err, sizeof err) == 0) {
        snprintf(msg, sizeof msg, "policy %s: this conversation's snapshot under %s restored (%lld tokens, %.1f MiB) in %.0f ms",
                 pol_set_spec(w->rt.ps)->text, newkey, (long long)n, (double)len / (1 << 20), (cli_now() - t0) * 1e3);
        post(w, UW_INFO, msg, 0, 0);
        ok = 1;
    } else {
        if (got == 0) {
            snprintf(msg, sizeof msg, "the snapshot under %s is not usable (%s); prefilling instead", newkey, err);
            post(w, UW_INFO, msg, 0, 0);
        }
        snprintf(msg, sizeof msg, "policy %s: no snapshot of this conversation under %s; prefilling its %lld tokens again",
                 pol_set_spec(w->rt.ps)->text, newkey, (long long)P);
        post(w, UW_INFO, msg, 0, 0);
        fwd_rewind(w->rt.f, 0);
        pol_set_probe_is_question(w->rt.ps, w->turns > 0);
        if (eval(w, w->seq, (size_t)P, err, sizeof err) == 0) {
            samp_load_state(w->s, s0);   /* eval recorded the tokens again for the penalty */
            w->n_seq = n_seq;
            ok = 1;
            char d[1024];
            pol_set_describe(w->rt.ps, d, sizeof d);
            snprintf(msg, sizeof msg, "prefilled under %s in %.1f s%s%s", pol_set_spec(w->rt.ps)->text, cli_now() - t0,
                     d[0] ? "; " : "", d);
            post(w, UW_INFO, msg, 0, 0);
            size_t sl;
            if (w->db && w->leaf && save_snapshot(w, w->leaf, &sl, err, sizeof err) == 0) {
                snprintf(msg, sizeof msg, "its snapshot is saved: switching back to %s later is instant", newkey);
                post(w, UW_INFO, msg, 0, 0);
            }
        } else {
            snprintf(msg, sizeof msg, "%s; back to %s", w->cancel ? "prefill cancelled" : err, old);
            post(w, UW_ERROR, msg, 0, 0);
        }
    }
    free(data);
    if (!ok) {
        /* the old policy and its cache, exactly as they were */
        int64_t n_old = 0;
        if (cli_set_policy(&w->rt, old, w->budget) || restore_snapshot(w, keep, keep_len, &n_old, err, sizeof err)) {
            snprintf(msg, sizeof msg, "could not go back to %s (%s); open the document again", old,
                     w->err_sink[0] ? w->err_sink : err);
            post(w, UW_ERROR, msg, 0, 0);
            drop_document(w);
        }
    }
    /* where /regen rewinds to: before the last answer, or the document's end */
    fwd_set_floor(w->rt.f, w->turns > 0 && w->ans_start > 0 ? w->ans_start - 1 : fwd_pos(w->rt.f));
    set_backtrack(w);
    free(s0);
    free(keep);
    publish(w);
}

static void first_session(void *ud, const store_session *ss)
{
    store_session *out = ud;
    if (!out->id) *out = *ss;   /* the list is newest first */
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
    char err[1200], k[256];
    store_session ss;
    memset(&ss, 0, sizeof ss);
    if (!w->db) {
        if (*key) post(w, UW_ERROR, "no session database: nothing to resume", 0, 0);
        else welcome(w);
        return;
    }
    int f = *key ? store_session_find(w->db, key, &ss) : store_session_list(w->db, first_session, &ss) || !ss.id;
    if (f != 0) {
        if (*key) {
            snprintf(err, sizeof err, "no session '%s' (kvchat sessions list shows them)", key);
            post(w, UW_ERROR, err, 0, 0);
        } else {
            welcome(w);
        }
        return;
    }
    if (strcmp(ss.model_sha, w->msha) != 0) {
        snprintf(err, sizeof err, "session %lld was made with another model (%s)", (long long)ss.id, ss.model_path);
        post(w, UW_ERROR, err, 0, 0);
        return;
    }
    int64_t leaf = 0;
    store_message *path = NULL;
    int n_path = 0;
    if (store_latest_message(w->db, ss.id, &leaf) || (leaf && store_message_path(w->db, leaf, &path, &n_path))) {
        post(w, UW_ERROR, store_error(w->db), 0, 0);
        return;
    }
    while (n_path > 0 && strcmp(path[n_path - 1].role, "assistant") != 0) {   /* an unanswered question */
        leaf = path[n_path - 1].parent;
        n_path--;
    }
    for (int i = 0; i < n_path; i++)
        post(w, !strcmp(path[i].role, "user") ? UW_PAST_USER : UW_PAST_ANSWER, path[i].text, 0, 0);
    w->chat = !strcmp(ss.format, "chat");
    sess_prefill_key(pol_set_spec(w->rt.ps), k, sizeof k);
    void *data = NULL;
    size_t len = 0;
    int g = leaf ? store_snapshot_get(w->db, leaf, k, &data, &len) : 1;
    fwd_rewind(w->rt.f, 0);
    samp_reset(w->s);
    w->n_seq = 0;
    if (g == 0) {
        double t0 = cli_now();
        int64_t n = 0;
        int bad = restore_snapshot(w, data, len, &n, err, sizeof err);
        free(data);
        if (bad) {
            char m[1400];
            snprintf(m, sizeof m, "cannot resume session %lld: %s", (long long)ss.id, err);
            post(w, UW_ERROR, m, 0, 0);
            store_messages_free(path, n_path);
            return;
        }
        snprintf(err, sizeof err, "session %lld resumed: %lld tokens restored from a %.1f MiB snapshot in %.0f ms",
                 (long long)ss.id, (long long)n, (double)len / (1 << 20), (cli_now() - t0) * 1e3);
        post(w, UW_INFO, err, 0, 0);
    } else {
        /* no snapshot under this policy: the document and the conversation are prefilled again */
        size_t dl;
        char *doc = cli_load_text(ss.doc_path, &dl, err, sizeof err);
        if (!doc) {
            post(w, UW_ERROR, err, 0, 0);
            store_messages_free(path, n_path);
            return;
        }
        size_t nn = 0, na = 0;
        int32_t *all = NULL, *ans = NULL;
        if (n_path < 2) {
            free(doc);
            post(w, UW_ERROR, "the session has no answer to continue from; /open its document again", 0, 0);
            store_messages_free(path, n_path);
            return;
        }
        /* the conversation up to the last question, then the last answer's text */
        const char *last = path[n_path - 1].text;
        if (sess_full_tokens(&w->rt, w->chat, doc, path, n_path - 2, path[n_path - 2].text, &all, &nn, err,
                             sizeof err) ||
            tok_encode(w->rt.m->vocab, last, strlen(last), 0, 0, &ans, &na, err, sizeof err)) {
            free(doc);
            free(all);
            post(w, UW_ERROR, err, 0, 0);
            store_messages_free(path, n_path);
            return;
        }
        int32_t *joined = realloc(all, sizeof(int32_t) * (nn + na + 1));
        if (!joined) {
            free(doc);
            free(all);
            free(ans);
            post(w, UW_ERROR, "out of memory", 0, 0);
            store_messages_free(path, n_path);
            return;
        }
        all = joined;
        memcpy(all + nn, ans, sizeof(int32_t) * na);
        nn += na;
        free(ans);
        free(doc);
        snprintf(err, sizeof err, "session %lld: no snapshot under %s, prefilling %zu tokens", (long long)ss.id, k, nn);
        post(w, UW_INFO, err, 0, 0);
        if (seq_add(w, all, (int64_t)nn) || eval(w, all, nn, err, sizeof err)) {
            post(w, UW_ERROR, w->cancel ? "cancelled" : err, 0, 0);
            free(all);
            fwd_rewind(w->rt.f, 0);
            w->n_seq = 0;
            store_messages_free(path, n_path);
            return;
        }
        free(all);
    }
    w->turns = n_path / 2;
    w->turn_base = w->turns;
    w->n_turns_here = 0;
    w->sid = ss.id;
    w->leaf = leaf;
    snprintf(w->doc_path, sizeof w->doc_path, "%s", ss.doc_path);
    pthread_mutex_lock(&w->mu);
    snprintf(w->view.doc, sizeof w->view.doc, "%s", ss.doc_title);
    w->view.have_doc = 1;
    pthread_mutex_unlock(&w->mu);
    store_messages_free(path, n_path);
    publish(w);
}

static void *run(void *arg)
{
    ui_worker *w = arg;
    cli_err_to(w->err_sink, sizeof w->err_sink);   /* the screen is the interface's */
    for (;;) {
        pthread_mutex_lock(&w->mu);
        while (w->job == JOB_NONE) pthread_cond_wait(&w->cv, &w->mu);
        int job = w->job;
        char *a = w->arg;
        w->arg = NULL;
        w->view.busy = job != JOB_QUIT;
        pthread_mutex_unlock(&w->mu);
        if (job == JOB_QUIT) {
            free(a);
            break;
        }
        w->cancel = 0;
        pthread_mutex_lock(&w->mu);
        if (w->have_pending) {   /* settings edited since the last job */
            samp_set_params(w->s, &w->pending_sp);
            w->n_predict = w->pending_n_predict;
            w->have_pending = 0;
        }
        pthread_mutex_unlock(&w->mu);
        w->err_sink[0] = 0;
        if (job == JOB_OPEN) {
            job_open(w, a);
            post(w, UW_DONE, "", 0, 1);
        } else if (job == JOB_POLICY) {
            job_policy(w, a ? a : "");
            post(w, UW_DONE, "", 0, 4);
        } else if (job == JOB_EDIT) {
            job_edit(w, a ? a : "");
        } else if (job == JOB_COMPARE) {
            job_compare(w, a ? a : "");
            post(w, UW_DONE, "", 0, 3);
        } else if (job == JOB_SEEN) {
            job_seen(w);
            post(w, UW_DONE, "", 0, 2);
        } else if (job == JOB_REGEN) {
            job_regen(w);
        } else if (job == JOB_RESUME) {
            job_resume(w, a ? a : "");
            post(w, UW_DONE, "", 0, 1);
        } else {
            job_ask(w, a);
        }
        free(a);
        pthread_mutex_lock(&w->mu);
        w->job = JOB_NONE;
        w->view.busy = 0;
        pthread_mutex_unlock(&w->mu);
    }
    return NULL;
}

ui_worker *uw_start(const cli_opts *o, int64_t n_predict)
{
    ui_worker *w = calloc(1, sizeof *w);
    if (!w) {
        cli_err("out of memory");
        return NULL;
    }
    w->o = *o;
    w->n_predict = n_predict;
    if (cli_open(&w->rt, &w->o, 1) != 0) {
        free(w);
        return NULL;
    }
    w->logits = malloc(sizeof(float) * (size_t)w->rt.m->hp.n_vocab);
    w->s = samp_create(&w->o.sp, w->rt.m->hp.n_vocab);
    if (!w->logits || !w->s) {
        cli_err("out of memory");
        uw_stop(w);
        return NULL;
    }
    w->chat = gguf_find_key(w->rt.m->gguf, "tokenizer.chat_template") >= 0;
    /* the conversation is saved as it goes; without a database it still works, unsaved */
    if (!w->o.no_db) {
        char mpath[1024];
        const char *mp = w->o.model_path ? w->o.model_path : cli_default_model_path(mpath, sizeof mpath);
        w->db = sess_db_open(w->o.db);
        if (w->db && sess_model(w->db, mp, w->rt.m, &w->model_id, w->msha)) {
            store_close(w->db);
            w->db = NULL;
        }
        if (w->db && w->o.db)
            snprintf(w->db_path, sizeof w->db_path, "%s", w->o.db);
        else if (w->db && store_default_path(w->db_path, sizeof w->db_path, 0))
            w->db_path[0] = 0;
    }
    snprintf(w->budget, sizeof w->budget, "%s", w->o.budget ? w->o.budget : "");
    const char *b = strrchr(w->rt.m->path, '/');
    snprintf(w->view.model, sizeof w->view.model, "%s", b ? b + 1 : w->rt.m->path);
    w->view.ctx_limit = fwd_n_ctx(w->rt.f);
    w->view.weights_mib = (double)w->rt.m->weight_bytes / (1 << 20);
    w->view.thr_valid = w->rt.thr.valid;
    w->view.thr_h = w->rt.thr.h_mean;
    w->view.thr_v = w->rt.thr.h_var;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    publish(w);
    if (pthread_create(&w->th, NULL, run, w) != 0) {
        cli_err("cannot start the engine thread");
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        samp_free(w->s);
        free(w->logits);
        cli_close(&w->rt);
        free(w);
        return NULL;
    }
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
    if (w->th) {
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
    samp_free(w->s);
    free(w->logits);
    free(w->arg);
    free(w->seq);
    free(w->map_base);
    free(w->answer);
    free(w->last_q);
    for (int i = 0; i < w->n_seen; i++) free(w->seen[i].text);
    free(w->seen);
    for (int i = 0; i < w->n_cmp; i++) free(w->cmp[i].text);
    for (int i = 0; i < MAX_TURNS; i++) free(w->turn_samp[i]);
    store_close(w->db);
    cli_close(&w->rt);
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

int uw_set_policy(ui_worker *w, const char *spec, const char *budget, char *err, size_t errlen)
{
    pthread_mutex_lock(&w->mu);
    int busy = w->job != JOB_NONE;
    pthread_mutex_unlock(&w->mu);
    if (busy) {
        snprintf(err, errlen, "wait for the current job (or Ctrl-C) before switching policy");
        return -1;
    }
    pol_spec ps;
    const char *b = budget ? budget : w->budget;
    if (pol_parse(&ps, spec, *b ? b : NULL, err, errlen)) return -1;
    /* the worker is idle: the budget is its to read when the job starts */
    if (budget) snprintf(w->budget, sizeof w->budget, "%s", budget);
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
