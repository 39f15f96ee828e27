/* session.c - one conversation about a document, the object every front end drives (see session.h).
 *
 * The sequence's token ids (seq) always start with what the cache holds; after an answer the last
 * sampled token is in seq but not yet in the cache (the next turn evaluates it first). Turns asked
 * through this object record where they began (cache position, ids, sampler state, the message
 * they reply to), so a branch rewinds to an exact point. */
#include "engine/session.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/quant.h"
#include "engine/chat.h"
#include "engine/document.h"
#include "engine/prompt.h"
#include "engine/snapshot.h"
#include "engine/tokenizer.h"

#define MAX_TURNS 64

struct session {
    sess_config cfg;
    model *m;
    be_backend *b;
    fwd_ctx *f;
    pol_set *ps;
    samp *s;
    unc_monitor *mon;
    float *logits;
    int backtrack;
    int chat;                    /* turns in the model's chat template (1) or the plain form (0) */
    int max_piece;               /* the most bytes one token of the vocabulary stands for */
    char err[1200];
    char load_note[256];         /* what loading did that a front end should say once ("" none) */
    char warn[300];              /* about the configuration, for the front end to show once */
    int policy_pending;          /* switched since the last answer without a rebuild: acts from the next */
    int column, n_columns;       /* sess_compare's column being generated (-1: none) */
    const char *column_policy;
    sess_callbacks cb;
    volatile sig_atomic_t *abort_flag;
    volatile sig_atomic_t never;   /* what abort_flag points at until a caller gives one */
    /* the sequence */
    int32_t *seq;
    int64_t n_seq, cap_seq;
    /* the document */
    int have_doc;
    char doc_path[1024], doc_title[256], doc_sha[65], title[256], name[128];
    int64_t doc_tokens;
    char *pending_doc;           /* deferred: prefilled with the next question */
    char **pending_turns;        /* deferred resume without a snapshot: the conversation's texts */
    int n_pending_turns;
    int64_t turns;               /* questions answered in this conversation */
    int64_t turn_pos[MAX_TURNS], turn_seq[MAX_TURNS], turn_parent[MAX_TURNS];
    void *turn_samp[MAX_TURNS];
    int n_turns_here;            /* turns recorded (0 .. MAX_TURNS) */
    int64_t turn_base;           /* the conversation's turn number of record 0 */
    int pending_record;          /* the turn being prepared is recorded at this index (-1: none) */
    /* the last answer */
    char *answer;
    size_t ans_len, ans_cap;
    int32_t *ans_ids;
    int64_t ans_n, ans_cap_ids;
    sess_answer last;
    char *last_q;
    int64_t ans_start, seq_ans;
    int64_t last_user;           /* the message the last answer replied to (a regeneration's parent) */
    int resumed;                 /* the cache came from a snapshot since the last answer */
    double restore_ms;
    /* persistence */
    sess_persist db;
    int have_db;
    int64_t sid, leaf;
    char msha[65];
    /* the decision trace (sess_trace): the text followed and its positions once found */
    char *trace_text;
    int64_t trace_lo, trace_hi;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Set the message and return code (a printf-style helper keeps call sites one line). */
static int fail(session *s, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(session *s, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof s->err, fmt, ap);
    va_end(ap);
    return code;
}

static void note(session *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(session *s, const char *fmt, ...)
{
    if (!s->cb.note) return;
    char msg[1600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    s->cb.note(s->cb.ud, msg);
}

static int cancelled(const session *s) { return *s->abort_flag != 0; }

static const char *base_name(const char *p)
{
    const char *b = strrchr(p, '/');
    return b ? b + 1 : p;
}

static int seq_add(session *s, const int32_t *ids, int64_t n)
{
    if (s->n_seq + n > s->cap_seq) {
        int64_t nc = (s->n_seq + n) * 2;
        int32_t *ns = realloc(s->seq, sizeof(int32_t) * (size_t)nc);
        if (!ns) return -1;
        s->seq = ns;
        s->cap_seq = nc;
    }
    memcpy(s->seq + s->n_seq, ids, sizeof(int32_t) * (size_t)n);
    s->n_seq += n;
    return 0;
}

static void answer_add(session *s, const char *p, size_t n)
{
    if (s->ans_len + n + 1 > s->ans_cap) {
        size_t nc = (s->ans_len + n + 1) * 2;
        char *na = realloc(s->answer, nc);
        if (!na) return;
        s->answer = na;
        s->ans_cap = nc;
    }
    memcpy(s->answer + s->ans_len, p, n);
    s->ans_len += n;
    s->answer[s->ans_len] = 0;
}

static void answer_reset(session *s)
{
    s->ans_len = 0;
    if (s->answer) s->answer[0] = 0;
    s->ans_n = 0;
}

void sess_messages_free(sess_message *m, int n)
{
    for (int i = 0; m && i < n; i++) free(m[i].text);
    free(m);
}

void sess_prefill_key(const pol_spec *spec, char *buf, size_t cap)
{
    /* the spec text lists the prefill policy first when there is one: "take:...+chess" */
    snprintf(buf, cap, "full");
    for (int i = 0; i < spec->n; i++) {
        if (spec->ops[i]->stage != POL_STAGE_PREFILL) continue;
        const char *plus = strchr(spec->text, '+');
        size_t n = plus ? (size_t)(plus - spec->text) : strlen(spec->text);
        snprintf(buf, cap, "%.*s", (int)n, spec->text);
    }
}

static void prefill_key(const session *s, char *buf, size_t cap) { sess_prefill_key(pol_set_spec(s->ps), buf, cap); }
static int restore_snapshot(session *s, const void *data, size_t len, int64_t *n_tokens);

/* ---- policies and the forward context */

static int attach_policy(session *s, const pol_spec *spec)
{
    pol_env env;
    fwd_policy_env(s->f, &env);
    pol_set *ps = pol_set_create(spec, &env, s->err, sizeof s->err);
    if (!ps) return SESS_EFAIL;
    fwd_set_policy(s->f, ps);
    pol_set_free(s->ps);
    s->ps = ps;
    return SESS_OK;
}

static void resolve_backtrack(session *s)
{
    s->backtrack = s->cfg.backtrack >= 0 ? s->cfg.backtrack : pol_set_can_reselect(s->ps) ? 2 : 0;
}

/* spec_text with budget (NULL or "": each policy's own) replaces the policies. */
static int set_policy_text(session *s, const char *spec_text, const char *budget)
{
    pol_spec spec;
    if (pol_parse(&spec, spec_text, budget && *budget ? budget : NULL, s->err, sizeof s->err)) return SESS_EFAIL;
    int rc = attach_policy(s, &spec);
    if (rc == SESS_OK) resolve_backtrack(s);
    return rc;
}

static int apply_head_similarity(session *s)
{
    const unc_thresholds *t = &s->cfg.thr;
    if (!t->valid || t->n_heads == 0) return fwd_set_head_similarity(s->f, NULL);
    int nl = s->m->hp.n_layer, nh = s->m->hp.n_head_kv;
    float *sim = malloc(sizeof(float) * (size_t)nl * (size_t)nh);
    if (!sim) return -1;
    for (int i = 0; i < nl * nh; i++) sim[i] = (float)NAN;
    for (int i = 0; i < t->n_heads; i++) {
        const unc_head_sim *e = &t->head_sim[i];
        if (e->layer < nl && e->head < nh) sim[e->layer * nh + e->head] = e->sim;
    }
    int rc = fwd_set_head_similarity(s->f, sim);
    free(sim);
    return rc;
}

static fwd_ctx *new_fwd(session *s, int page_size)
{
    fwd_opts fo = { s->cfg.n_ctx, s->cfg.n_batch, page_size };
    if (fo.n_ctx <= 0) fo.n_ctx = s->m->hp.n_ctx_train;   /* pages are allocated as tokens arrive */
    return fwd_create(s->m, s->b, &fo, s->err, sizeof s->err);
}

/* The forward context again with another KV page size (a snapshot's), keeping the policies' spec. */
static int reopen_fwd(session *s, int page_size)
{
    fwd_ctx *f = new_fwd(s, page_size);
    if (!f) return SESS_EFAIL;
    pol_spec spec = *pol_set_spec(s->ps);
    fwd_free(s->f);
    s->f = f;
    if (apply_head_similarity(s)) return fail(s, SESS_EFAIL, "out of memory");
    return attach_policy(s, &spec);
}

/* A device backend copies every weight it will multiply now, so a model too large for the device is
 * a clear error before anything runs. The CUDA backend keeps most types as stored and converts the
 * others to f16 (docs/gpu.md): the load note names them. */
static int prepare_weights(session *s)
{
    if (!s->b->ops->prepare) return 0;
    int n = model_matmul_weights(s->m, NULL, 0);
    const be_weight **w = malloc(sizeof *w * (size_t)n);
    if (!w) return fail(s, -1, "out of memory");
    model_matmul_weights(s->m, w, n);
    int rc = s->b->ops->prepare(s->b, w, n, s->err, sizeof s->err);
    if (rc == 0 && !strcmp(s->b->ops->name, "cuda")) {
        char conv[160] = "";
        for (int i = 0; i < n; i++) {
            const char *name = quant_type_name(w[i]->type);
            if (be_gpu_weight_type(w[i]->type, w[i]->n_in) != w[i]->type && !strstr(conv, name))
                snprintf(conv + strlen(conv), sizeof conv - strlen(conv), "%s%s", conv[0] ? ", " : "", name);
        }
        if (conv[0])
            snprintf(s->load_note, sizeof s->load_note, "%s weights are converted to f16 on the GPU (2 bytes a value)",
                     conv);
    }
    free(w);
    return rc;
}

const char *sess_load_note(const session *s) { return s->load_note; }

session *sess_create(const sess_config *cfg, char *err, size_t errlen)
{
    session *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->cfg = *cfg;
    if (s->cfg.n_predict <= 0) s->cfg.n_predict = 128;
    s->abort_flag = &s->never;
    s->pending_record = -1;
    s->column = -1;
    model_load_opts lo = { cfg->tokenizer_path };
    if (model_load(&s->m, cfg->model_path, &lo, s->err, sizeof s->err) != 0) goto fail;
    /* CUDA when asked for, or by default when a device is present */
    int cuda = cfg->device == SESS_DEVICE_CUDA || (cfg->device == SESS_DEVICE_AUTO && be_cuda_devices() > 0);
    s->b = cuda ? be_cuda_create(cfg->n_threads, s->err, sizeof s->err)
                : be_cpu_create(cfg->n_threads, s->err, sizeof s->err);
    if (!s->b || prepare_weights(s)) goto fail;
    if (!(s->f = new_fwd(s, cfg->page_size))) goto fail;
    if (apply_head_similarity(s)) {
        snprintf(s->err, sizeof s->err, "out of memory");
        goto fail;
    }
    pol_spec spec = cfg->policy;
    if (spec.n == 0 && pol_parse(&spec, NULL, cfg->budget[0] ? cfg->budget : NULL, s->err, sizeof s->err)) goto fail;
    if (attach_policy(s, &spec)) goto fail;
    resolve_backtrack(s);
    /* calibrated thresholds hold for windows of the size they were measured on */
    int up = cfg->thr.valid && cfg->thr.page > 0 ? cfg->thr.page : kv_page_size(fwd_kv(s->f));
    s->mon = unc_create(up, 0);
    s->logits = malloc(sizeof(float) * (size_t)s->m->hp.n_vocab);
    s->s = samp_create(&cfg->sp, s->m->hp.n_vocab);
    if (!s->mon || !s->logits || !s->s) {
        snprintf(s->err, sizeof s->err, "out of memory");
        goto fail;
    }
    s->chat = cfg->format == SESS_FORMAT_AUTO ? prompt_has_template(s->m) : cfg->format;
    for (int32_t i = 0; i < tok_n_vocab(s->m->vocab); i++) {
        const char *p = tok_piece(s->m->vocab, i);
        int l = p ? (int)strlen(p) : 0;
        if (l > s->max_piece) s->max_piece = l;
    }
    if (s->max_piece < 1) s->max_piece = 1;
    if (cfg->n_ctx > s->m->hp.n_ctx_train)
        snprintf(s->warn, sizeof s->warn, "--ctx %lld is above the %lld tokens %s was trained on: past that length "
                 "its answers degrade", (long long)cfg->n_ctx, (long long)s->m->hp.n_ctx_train, base_name(s->m->path));
    return s;
fail:
    snprintf(err, errlen, "%s", s->err);
    sess_free(s);
    return NULL;
}

static void clear_pending(session *s)
{
    free(s->pending_doc);
    s->pending_doc = NULL;
    for (int i = 0; i < s->n_pending_turns; i++) free(s->pending_turns[i]);
    free(s->pending_turns);
    s->pending_turns = NULL;
    s->n_pending_turns = 0;
}

void sess_free(session *s)
{
    if (!s) return;
    clear_pending(s);
    fwd_free(s->f);
    pol_set_free(s->ps);
    unc_free(s->mon);
    be_free(s->b);
    model_free(s->m);
    samp_free(s->s);
    free(s->logits);
    free(s->seq);
    free(s->answer);
    free(s->ans_ids);
    free(s->last_q);
    free(s->trace_text);
    for (int i = 0; i < MAX_TURNS; i++) free(s->turn_samp[i]);
    free(s);
}

int sess_trace(session *s, const char *text)
{
    free(s->trace_text);
    s->trace_text = NULL;
    s->trace_lo = s->trace_hi = 0;
    if (text && !(s->trace_text = strdup(text))) return fail(s, SESS_EFAIL, "out of memory");
    return SESS_OK;
}

const char *sess_trace_text(const session *s, int64_t *lo, int64_t *hi)
{
    *lo = s->trace_lo;
    *hi = s->trace_hi;
    return pol_set_trace_text(s->ps);
}

/* The trace of the next evaluation follows the traced text's first place in the sequence. */
static int start_trace(session *s)
{
    if (!s->trace_text) return SESS_OK;
    int64_t lo, hi;
    if (tok_find_text(s->m->vocab, s->seq, (size_t)s->n_seq, s->trace_text, &lo, &hi))
        return fail(s, SESS_EFAIL, "the traced text '%.200s' is not in the prompt", s->trace_text);
    if (pol_set_trace(s->ps, lo, hi)) return fail(s, SESS_EFAIL, "out of memory");
    s->trace_lo = lo;
    s->trace_hi = hi;
    return SESS_OK;
}

const char *sess_error(const session *s) { return s->err; }
const char *sess_warning(const session *s) { return s->warn; }

void sess_set_callbacks(session *s, const sess_callbacks *cb, volatile sig_atomic_t *abort_flag)
{
    if (cb)
        s->cb = *cb;
    else
        memset(&s->cb, 0, sizeof s->cb);
    s->abort_flag = abort_flag ? abort_flag : &s->never;
}

int sess_attach_store(session *s, const sess_persist *db)
{
    s->have_db = 0;
    s->msha[0] = 0;
    if (!db) return SESS_OK;
    if (db->model(db->ud, s->m->path, s->m, s->msha, s->err, sizeof s->err)) return SESS_EFAIL;
    s->db = *db;
    s->have_db = 1;
    return SESS_OK;
}

/* ---- evaluating and answering */

/* Evaluate ids at the end of the sequence (a prefill: the prefill policy runs); the sampler records
 * them for its repetition penalty. The caller has added them to seq. */
static int eval(session *s, const int32_t *ids, size_t n)
{
    if (fwd_pos(s->f) + (int64_t)n + 1 > fwd_n_ctx(s->f))
        return fail(s, SESS_ENOFIT, "%zu more tokens do not fit: %lld of the context's %lld are used", n,
                    (long long)fwd_pos(s->f), (long long)fwd_n_ctx(s->f));
    for (size_t i = 0; i < n; i++) samp_accept(s->s, ids[i]);
    if (fwd_eval(s->f, ids, (int64_t)n, s->logits, NULL, NULL, s->cb.progress, s->cb.ud, s->abort_flag, s->err,
                 sizeof s->err))
        return cancelled(s) ? fail(s, SESS_ECANCELLED, "cancelled") : SESS_EFAIL;
    return SESS_OK;
}

typedef struct stream {
    session *s;
    tok_stream ts;
    int keep;                    /* the answer's ids join the sequence (0: a side query) */
} stream;

static void on_token(void *ud, int32_t id)
{
    stream *st = ud;
    session *s = st->s;
    char piece[512];
    size_t n = tok_stream_feed(&st->ts, id, piece, sizeof piece - 1);
    answer_add(s, piece, n);
    if (s->ans_n == s->ans_cap_ids) {
        int64_t nc = s->ans_cap_ids ? s->ans_cap_ids * 2 : 256;
        int32_t *ni = realloc(s->ans_ids, sizeof(int32_t) * (size_t)nc);
        if (ni) {
            s->ans_ids = ni;
            s->ans_cap_ids = nc;
        }
    }
    if (s->ans_n < s->ans_cap_ids) s->ans_ids[s->ans_n++] = id;
    if (st->keep) seq_add(s, &id, 1);
    if (n && s->cb.text) s->cb.text(s->cb.ud, piece, n);
    if (s->column >= 0 && s->cb.column) s->cb.column(s->cb.ud, s->column, s->n_columns, s->column_policy, s->ans_n);
}

static void on_page(void *ud, int64_t page, const unc_stats *us)
{
    stream *st = ud;
    if (st->s->cb.page) st->s->cb.page(st->s->cb.ud, page, us);
}

static void on_event(void *ud, const unc_event *e)
{
    stream *st = ud;
    if (st->s->cb.event) st->s->cb.event(st->s->cb.ud, e);
}

/* The plain completion form's own next turn: a base model that goes on writing questions and
 * answers stops where its next question would begin. */
#define PLAIN_NEXT_TURN "\nQuestion:"

int sess_stops(const session *s, int answering, const char **out, int max)
{
    int n = 0;
    if (answering && !s->chat && n < max) out[n++] = PLAIN_NEXT_TURN;
    for (int i = 0; i < s->cfg.n_stop && n < max; i++)
        if (s->cfg.stop[i][0]) out[n++] = s->cfg.stop[i];
    return n;
}

/* Generate after the evaluated prompt (its last token prev): the text through the callbacks, the ids
 * into the answer (and into seq when keep). answering: a turn of the conversation (the format's
 * next-turn marker stops it), not a raw continuation. */
static int generate(session *s, int32_t prev, int64_t n_predict, int max_regen, int keep, int answering,
                    gen_result *gr)
{
    answer_reset(s);
    stream st = { s, { 0 }, keep };
    tok_stream_init(&st.ts, s->m->vocab);
    const char *stops[SESS_MAX_STOP + 1];
    int n_stop = sess_stops(s, answering, stops, SESS_MAX_STOP + 1);
    int64_t seq0 = s->n_seq;
    gen_opts go = { n_predict, prev, &s->cfg.thr, max_regen, samp_temperature(s->s),
                    s->cfg.monitor || s->cb.page != NULL, stops, n_stop };
    gen_callbacks cb = { &st, on_token, on_page, on_event };
    if (gen_answer(s->f, s->s, s->m->vocab, s->mon, s->logits, s->m->hp.n_vocab, &go, &cb, s->abort_flag, gr, s->err,
                   sizeof s->err))
        return SESS_EFAIL;
    char piece[512];
    size_t k = tok_stream_flush(&st.ts, piece, sizeof piece - 1);
    answer_add(s, piece, k);
    if (k && s->cb.text) s->cb.text(s->cb.ud, piece, k);
    int64_t target = s->n_seq > seq0 ? s->n_seq - 1 : s->n_seq;
    if (keep && fwd_pos(s->f) > target) {
        /* a stop sequence: the cache went past the kept tokens; back to them (the last one sampled,
         * not evaluated, as after any answer), replaying what sliding-window layers no longer hold */
        int64_t r = fwd_rewind(s->f, target);
        if (r < target && fwd_eval(s->f, s->seq + r, target - r, s->logits, NULL, NULL, NULL, NULL, s->abort_flag, s->err,
                                   sizeof s->err))
            return cancelled(s) ? fail(s, SESS_ECANCELLED, "cancelled") : SESS_EFAIL;
    }
    return SESS_OK;
}

/* The stored conversation's row, created when the first turn is saved (or a document prefilled). */
static int ensure_stored(session *s)
{
    if (s->sid || !s->have_db || !s->have_doc) return SESS_OK;
    sess_stored st;
    memset(&st, 0, sizeof st);
    snprintf(st.name, sizeof st.name, "%s", s->name);
    snprintf(st.title, sizeof st.title, "%s", s->title);
    snprintf(st.model_sha, sizeof st.model_sha, "%s", s->msha);
    snprintf(st.model_path, sizeof st.model_path, "%s", s->m->path);
    snprintf(st.doc_path, sizeof st.doc_path, "%s", s->doc_path);
    snprintf(st.doc_sha, sizeof st.doc_sha, "%s", s->doc_sha);
    snprintf(st.doc_title, sizeof st.doc_title, "%s", s->doc_title);
    snprintf(st.policy, sizeof st.policy, "%s", pol_set_spec(s->ps)->text);
    snprintf(st.budget, sizeof st.budget, "%s", s->cfg.budget);
    snprintf(st.format, sizeof st.format, "%s", s->chat ? "chat" : "plain");
    char e[1024];
    if (s->db.create(s->db.ud, &st, s->doc_tokens, &s->sid, e, sizeof e)) {
        s->sid = 0;
        return fail(s, SESS_ESAVE, "not saved: %s", e);
    }
    return SESS_OK;
}

/* A snapshot of the sequence as it is, filed under message msg and the current prefill policy. */
static int save_snapshot(session *s, int64_t msg, size_t *len)
{
    char key[256], e[1024];
    snap_identity id;
    snap_identity_of(s->f, s->msha, &id);
    void *data;
    prefill_key(s, key, sizeof key);
    if (snap_save(s->f, s->s, &id, s->seq, s->n_seq, &data, len, s->err, sizeof s->err)) return -1;
    int bad = s->db.put_snapshot(s->db.ud, s->sid, msg, key, s->n_seq, data, *len, e, sizeof e);
    free(data);
    if (bad) snprintf(s->err, sizeof s->err, "%s", e);
    return bad ? -1 : 0;
}

/* Both messages of the turn (a regeneration: the answer only, beside the first) and its events. */
static int save_messages(session *s, const char *question, int regen, const char *metrics, int64_t *um, int64_t *am,
                         char *e, size_t elen)
{
    int n_ev;
    const unc_event *ev = unc_events(s->mon, &n_ev);
    const char *pol = pol_set_spec(s->ps)->text;
    if (regen)
        *um = s->last_user;
    else if (s->db.add_message(s->db.ud, s->sid, s->leaf, "user", question, pol, NULL, um, e, elen))
        return -1;
    s->last_user = *um;
    if (s->db.add_message(s->db.ud, s->sid, *um, "assistant", s->answer ? s->answer : "", pol, metrics, am, e, elen) ||
        s->db.add_events(s->db.ud, *am, ev, n_ev, e, elen))
        return -1;
    return 0;
}

/* When the stored conversation was deleted meanwhile (by another kvchat), a new one is made for it
 * (its earlier messages are gone; the cache, whose snapshot follows, is whole). 1 when it was, 0 when
 * the row is there, -1 on failure. */
static int reattach_if_deleted(session *s)
{
    char key[32], e[1024];
    sess_stored st;
    snprintf(key, sizeof key, "#%lld", (long long)s->sid);
    if (s->db.find(s->db.ud, key, &st, e, sizeof e) != 1) return 0;
    int64_t old = s->sid;
    s->sid = s->leaf = s->last_user = 0;
    if (ensure_stored(s)) return -1;
    note(s, "session %lld was deleted meanwhile (by another kvchat): this conversation goes on as session %lld, "
         "without the earlier messages", (long long)old, (long long)s->sid);
    return 1;
}

/* The turn goes into the store: both messages (a regeneration: the answer only, beside the first),
 * the events, a snapshot of the sequence. */
static int save_turn(session *s, const char *question, int regen)
{
    sess_answer *a = &s->last;
    a->saved[0] = 0;
    a->user_msg = a->answer_msg = 0;
    a->snapshot_bytes = 0;
    if (!s->have_db || !s->have_doc) return SESS_OK;
    int rc = ensure_stored(s);
    if (rc) return rc;
    char mj[1024], e[1024];
    kv_stats ks;
    kv_get_stats(fwd_kv(s->f), &ks);
    snprintf(mj, sizeof mj,
             "{\"policy\": \"%s\", \"prompt_tokens\": %lld, \"answer_tokens\": %lld, \"prefill_s\": %.3f, "
             "\"decode_s\": %.3f, \"kv_bytes\": %llu, \"kv_full_bytes\": %llu, \"events\": %d, \"regenerated\": %d, "
             "\"resumed_from_snapshot\": %s, \"restore_ms\": %.1f}",
             pol_set_spec(s->ps)->text, (long long)a->prompt_tokens, (long long)a->gen.n_gen, a->prefill_s, a->decode_s,
             (unsigned long long)ks.bytes_resident, (unsigned long long)ks.bytes_full, a->gen.events,
             a->gen.regenerated, a->resumed ? "true" : "false", a->restore_ms);
    int64_t um, am;
    if (save_messages(s, question, regen, mj, &um, &am, e, sizeof e)) {
        /* the conversation's row may be gone (deleted by another kvchat): it goes on as a new one */
        int r = reattach_if_deleted(s);
        if (r < 0) return fail(s, SESS_ESAVE, "not saved: %.900s", s->err);
        if (r == 0 || save_messages(s, question, 0, mj, &um, &am, e, sizeof e))
            return fail(s, SESS_ESAVE, "not saved: %s", e);
    }
    s->leaf = am;
    a->user_msg = um;
    a->answer_msg = am;
    double t0 = now_s();
    size_t len;
    if (save_snapshot(s, am, &len)) return fail(s, SESS_ESAVE, "saved without a snapshot: %.900s", s->err);
    a->save_ms = (now_s() - t0) * 1e3;
    a->snapshot_bytes = len;
    snprintf(a->saved, sizeof a->saved, "session %lld (snapshot %.1f MiB)", (long long)s->sid,
             (double)len / (1 << 20));
    return SESS_OK;
}

/* The answer to question (its prompt is evaluated: the logits are ready), then the turn saved. */
static int answer(session *s, const char *question, int32_t prev, int regen, int64_t prompt_tokens, double prefill_s)
{
    sess_answer *a = &s->last;
    memset(a, 0, sizeof *a);
    a->prompt_tokens = prompt_tokens;
    a->prefill_s = prefill_s;
    a->resumed = s->resumed;
    a->restore_ms = s->restore_ms;
    s->resumed = 0;
    s->ans_start = a->prompt_end = fwd_pos(s->f);
    s->seq_ans = s->n_seq;
    fwd_set_floor(s->f, s->ans_start - 1);   /* a regeneration rewinds here exactly */
    s->policy_pending = 0;
    double t0 = now_s();
    int rc = generate(s, prev, s->cfg.n_predict, s->backtrack, 1, 1, &a->gen);
    if (rc) {
        s->pending_record = -1;
        return rc;
    }
    a->decode_s = now_s() - t0;
    s->turns++;
    if (!regen && s->pending_record == s->n_turns_here && s->pending_record >= 0) s->n_turns_here++;
    s->pending_record = -1;
    if (question != s->last_q) {
        char *q = strdup(question);
        if (q) {
            free(s->last_q);
            s->last_q = q;
        }
    }
    a->text = s->answer ? s->answer : "";
    a->ids = s->ans_ids;
    a->n_ids = s->ans_n;
    return save_turn(s, question, regen);
}

/* Where the turn about to be asked begins, for sess_branch; a full table stops recording. */
static void record_turn_start(session *s)
{
    s->pending_record = -1;
    int r = s->n_turns_here;
    if (r >= MAX_TURNS || (!s->turn_samp[r] && !(s->turn_samp[r] = malloc(samp_state_size())))) return;
    s->turn_pos[r] = fwd_pos(s->f);
    s->turn_seq[r] = s->n_seq;
    s->turn_parent[r] = s->leaf;
    samp_save_state(s->s, s->turn_samp[r]);
    s->pending_record = r;
}

static int gemma_turns(const session *s) { return s->chat && chat_family_for(s->m->gguf) == CHAT_GEMMA; }

/* The next turn's tokens join the sequence and what the cache lacks (the last answer's final token,
 * sampled but never evaluated, then the turn) is evaluated; *prev gets the last evaluated token. */
static int prepare_turn(session *s, const char *question, int32_t *prev, int64_t *n_eval, double *secs)
{
    int32_t *ids = NULL;
    size_t n = 0;
    int bad = s->turns > 0
                  ? prompt_continue(s->m, s->chat, question, &ids, &n, s->err, sizeof s->err)
                  : prompt_first_question(s->m, gemma_turns(s), s->have_doc, question, &ids, &n, s->err, sizeof s->err);
    if (bad) return SESS_EFAIL;
    int64_t from = fwd_pos(s->f);
    int64_t total = s->n_seq + (int64_t)n;
    if (total + 1 > fwd_n_ctx(s->f)) {
        free(ids);
        return fail(s, SESS_ENOFIT, "the conversation and question are %lld tokens, longer than the context of %lld tokens",
                    (long long)total, (long long)fwd_n_ctx(s->f));
    }
    if (pol_set_check(s->ps, total, s->err, sizeof s->err)) {
        free(ids);
        return SESS_EFAIL;
    }
    record_turn_start(s);
    int64_t n_seq0 = s->n_seq;
    if (seq_add(s, ids, (int64_t)n)) {
        free(ids);
        s->pending_record = -1;
        return fail(s, SESS_EFAIL, "out of memory");
    }
    free(ids);
    n = (size_t)(s->n_seq - from);
    if (start_trace(s)) {
        s->n_seq = n_seq0;
        s->pending_record = -1;
        return SESS_EFAIL;
    }
    pol_set_probe_is_question(s->ps, 1);
    double t0 = now_s();
    int rc = eval(s, s->seq + from, n);
    if (rc) {
        s->n_seq = n_seq0;   /* the turn did not happen */
        s->pending_record = -1;
        return rc;
    }
    *secs = now_s() - t0;
    *n_eval = (int64_t)n;
    *prev = s->seq[s->n_seq - 1];
    return SESS_OK;
}

/* A deferred document (and, resumed without a snapshot, the conversation so far) with question,
 * prefilled together so the prefill policies see the question. */
static int prepare_pending(session *s, const char *question, int32_t *prev, int64_t *n_eval, double *secs)
{
    int32_t *ids = NULL;
    size_t n = 0;
    if (prompt_conversation(s->m, s->chat, s->pending_doc, (const char *const *)s->pending_turns, s->n_pending_turns,
                            question, &ids, &n, s->err, sizeof s->err))
        return SESS_EFAIL;
    if ((int64_t)n + 1 > fwd_n_ctx(s->f)) {
        free(ids);
        return fail(s, SESS_ENOFIT, "the %s and question are %zu tokens, longer than the context of %lld tokens",
                    s->n_pending_turns ? "conversation" : "document", n, (long long)fwd_n_ctx(s->f));
    }
    if (pol_set_check(s->ps, (int64_t)n, s->err, sizeof s->err)) {
        free(ids);
        return SESS_EFAIL;
    }
    fwd_rewind(s->f, 0);
    samp_reset(s->s);
    s->n_seq = 0;
    if (seq_add(s, ids, (int64_t)n)) {
        free(ids);
        return fail(s, SESS_EFAIL, "out of memory");
    }
    free(ids);
    if (start_trace(s)) {
        s->n_seq = 0;
        return SESS_EFAIL;
    }
    pol_set_probe_is_question(s->ps, 1);
    double t0 = now_s();
    int rc = eval(s, s->seq, n);
    if (rc) {
        s->n_seq = 0;
        return rc;
    }
    *secs = now_s() - t0;
    *n_eval = (int64_t)n;
    *prev = s->seq[n - 1];
    if (!s->doc_tokens) s->doc_tokens = (int64_t)n;
    clear_pending(s);
    return SESS_OK;
}

int sess_ask(session *s, const char *question)
{
    if (!question || !*question) return fail(s, SESS_EFAIL, "the question is empty");
    if (tok_utf8_invalid_at(question, strlen(question)) >= 0) return fail(s, SESS_EFAIL, "the question is not valid UTF-8");
    int32_t prev;
    int64_t n = 0;
    double secs = 0;
    int rc = s->pending_doc ? prepare_pending(s, question, &prev, &n, &secs) : prepare_turn(s, question, &prev, &n, &secs);
    if (rc) return rc;
    return answer(s, question, prev, 0, n, secs);
}

/* ---- documents */

static void reset_conversation(session *s)
{
    fwd_rewind(s->f, 0);
    samp_reset(s->s);
    clear_pending(s);
    s->n_seq = 0;
    s->turns = 0;
    s->turn_base = 0;
    s->n_turns_here = 0;
    s->pending_record = -1;
    s->sid = s->leaf = s->last_user = 0;
    s->ans_start = s->seq_ans = 0;
    s->resumed = 0;
    s->policy_pending = 0;   /* a new conversation is built under the policy as it is */
    free(s->last_q);
    s->last_q = NULL;
    answer_reset(s);
}

/* The cache is empty again and no document is loaded (a rebuild that failed half way). */
static void drop_document(session *s)
{
    fwd_rewind(s->f, 0);
    s->n_seq = 0;
    s->have_doc = 0;
}

/* The loaded conversation, kept while another document is prefilled, so a cancel or a failure goes
 * back to it exactly (its cache from a snapshot in memory, the rest as it was). */
typedef struct kept_conv {
    void *snap;
    size_t snap_len;
    char doc_path[1024], doc_title[256], doc_sha[65], title[256], name[128];
    int64_t doc_tokens, turns, turn_base, sid, leaf, last_user, ans_start, seq_ans;
    int n_turns_here;
    char *last_q;
} kept_conv;

static int keep_conversation(session *s, kept_conv *k)
{
    memset(k, 0, sizeof *k);
    if (!s->have_doc || s->pending_doc || s->n_seq == 0) return 0;
    snap_identity id;
    snap_identity_of(s->f, s->msha, &id);
    if (snap_save(s->f, s->s, &id, s->seq, s->n_seq, &k->snap, &k->snap_len, s->err, sizeof s->err)) return -1;
    memcpy(k->doc_path, s->doc_path, sizeof k->doc_path);
    memcpy(k->doc_title, s->doc_title, sizeof k->doc_title);
    memcpy(k->doc_sha, s->doc_sha, sizeof k->doc_sha);
    memcpy(k->title, s->title, sizeof k->title);
    memcpy(k->name, s->name, sizeof k->name);
    k->doc_tokens = s->doc_tokens;
    k->turns = s->turns;
    k->turn_base = s->turn_base;
    k->sid = s->sid;
    k->leaf = s->leaf;
    k->last_user = s->last_user;
    k->ans_start = s->ans_start;
    k->seq_ans = s->seq_ans;
    k->n_turns_here = s->n_turns_here;
    k->last_q = s->last_q;   /* reset_conversation must not free it now */
    s->last_q = NULL;
    return 0;
}

/* Back to the kept conversation; 0, or -1 when its cache could not be restored (none is loaded). */
static int restore_conversation(session *s, kept_conv *k)
{
    int64_t n;
    if (!k->snap || restore_snapshot(s, k->snap, k->snap_len, &n)) return -1;
    memcpy(s->doc_path, k->doc_path, sizeof k->doc_path);
    memcpy(s->doc_title, k->doc_title, sizeof k->doc_title);
    memcpy(s->doc_sha, k->doc_sha, sizeof k->doc_sha);
    memcpy(s->title, k->title, sizeof k->title);
    memcpy(s->name, k->name, sizeof k->name);
    s->doc_tokens = k->doc_tokens;
    s->turns = k->turns;
    s->turn_base = k->turn_base;
    s->sid = k->sid;
    s->leaf = k->leaf;
    s->last_user = k->last_user;
    s->ans_start = k->ans_start;
    s->seq_ans = k->seq_ans;
    s->n_turns_here = k->n_turns_here;
    free(s->last_q);
    s->last_q = k->last_q;
    k->last_q = NULL;
    s->have_doc = 1;
    fwd_set_floor(s->f, s->turns > 0 && s->ans_start > 0 ? s->ans_start - 1 : fwd_pos(s->f));
    return 0;
}

static void kept_free(kept_conv *k)
{
    free(k->snap);
    free(k->last_q);
    memset(k, 0, sizeof *k);
}

/* The most bytes a document that fits the context can have: every token stands for at most
 * max_piece bytes of text. */
static size_t doc_cap(const session *s) { return (size_t)fwd_n_ctx(s->f) * (size_t)s->max_piece; }

/* The document at path, refused before it is read when its size alone proves it cannot fit. */
static char *load_document(session *s, const char *path, size_t *len, int *code)
{
    struct stat st;
    size_t cap = doc_cap(s);
    *code = SESS_EFAIL;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size > cap) {
        *code = SESS_ENOFIT;
        fail(s, SESS_ENOFIT, "%s is %lld bytes, so at least %lld tokens (a token of this model stands for at most %d "
             "bytes): longer than the context of %lld tokens (use --ctx or a shorter document)", path,
             (long long)st.st_size, (long long)(st.st_size / s->max_piece), s->max_piece, (long long)fwd_n_ctx(s->f));
        return NULL;
    }
    return doc_load(path, cap, len, s->err, sizeof s->err);
}

int sess_open_document(session *s, const char *given, const char *title, const char *name, int defer)
{
    size_t len;
    char abs_path[1024];
    int from_stdin = !strcmp(given, "-");
    /* the conversation keeps the absolute path, so it resumes from any directory */
    char *rp = from_stdin ? NULL : realpath(given, NULL);
    snprintf(abs_path, sizeof abs_path, "%s", rp && strlen(rp) < sizeof abs_path ? rp : given);
    free(rp);
    int code;
    char *text = load_document(s, abs_path, &len, &code);
    if (!text) return code;
    if (strspn(text, " \t\r\n\f\v") == len) {
        free(text);
        return fail(s, SESS_EFAIL, "%s is empty%s: nothing to ask about", from_stdin ? "the standard input" : given,
                    len ? " (only white space)" : "");
    }
    char sha[65];
    snap_sha256_bytes(text, len, sha);
    int32_t *ids = NULL;
    size_t n = 0;
    if (!defer) {
        /* the document alone, the way its turn continues with the first question; say whether it
         * fits before spending time on it: a document is never cut */
        if (prompt_document(s->m, gemma_turns(s), text, &ids, &n, s->err, sizeof s->err)) {
            free(text);
            return SESS_EFAIL;
        }
        int64_t limit = fwd_n_ctx(s->f);
        if ((int64_t)n + 64 > limit) {
            free(ids);
            free(text);
            return fail(s, SESS_ENOFIT, "%s is %zu tokens; the context holds %lld (use --ctx or a shorter document)",
                        abs_path, n, (long long)limit);
        }
    }
    kept_conv kept;
    if (!defer && keep_conversation(s, &kept)) {
        free(ids);
        free(text);
        return SESS_EFAIL;
    }
    reset_conversation(s);
    s->have_doc = 0;
    const char *label = from_stdin ? "stdin" : base_name(abs_path);
    snprintf(s->doc_path, sizeof s->doc_path, "%s", abs_path);
    snprintf(s->doc_title, sizeof s->doc_title, "%.250s", label);
    snprintf(s->title, sizeof s->title, "%.200s", title ? title : label);
    snprintf(s->name, sizeof s->name, "%s", name ? name : "");
    snprintf(s->doc_sha, sizeof s->doc_sha, "%s", sha);
    s->doc_tokens = (int64_t)n;
    if (defer) {
        s->pending_doc = text;
        s->have_doc = 1;
        return SESS_OK;
    }
    uint64_t full = (uint64_t)n * (uint64_t)s->m->hp.n_layer * (uint64_t)s->m->hp.n_head_kv *
                    (uint64_t)s->m->hp.head_dim * 4u;
    note(s, "%.700s: %zu tokens of %lld, a full cache would need %.1f MiB; prefilling under %.250s", abs_path, n,
         (long long)fwd_n_ctx(s->f), (double)full / (1 << 20), pol_set_spec(s->ps)->text);
    free(text);
    pol_set_probe_is_question(s->ps, 0);   /* no question yet: the probe is the document's end */
    int rc = seq_add(s, ids, (int64_t)n) ? fail(s, SESS_EFAIL, "out of memory") : eval(s, ids, n);
    free(ids);
    if (rc) {
        char e[1100];
        snprintf(e, sizeof e, "%.1000s", rc == SESS_ECANCELLED ? "prefill cancelled" : s->err);
        drop_document(s);
        if (!kept.snap)
            fail(s, rc, "%s; no document is loaded", e);
        else if (restore_conversation(s, &kept) == 0)
            fail(s, rc, "%s; back to %.250s as it was", e, s->doc_title);
        else
            fail(s, rc, "%s; the conversation before it could not be restored (%.300s): no document is loaded", e,
                 s->err);
        kept_free(&kept);
        return rc;
    }
    kept_free(&kept);
    s->have_doc = 1;
    fwd_set_floor(s->f, fwd_pos(s->f));
    char d[1024];
    pol_set_describe(s->ps, d, sizeof d);
    note(s, "%s", d[0] ? d : "document loaded");
    if (ensure_stored(s)) {
        char e[1200];
        snprintf(e, sizeof e, "%.1000s", s->err);
        return fail(s, SESS_ESAVE, "this conversation is %.1100s", e);
    }
    return SESS_OK;
}

/* ---- snapshots */

/* Restore the sequence from snapshot bytes (a cache of the snapshot's page size when none was asked
 * for). On failure nothing changed. */
static int restore_snapshot(session *s, const void *data, size_t len, int64_t *n_tokens)
{
    int ps = snap_page_size(data, len);
    if (ps > 0 && ps != kv_page_size(fwd_kv(s->f)) && !s->cfg.page_size && reopen_fwd(s, ps)) {
        char e[1200];
        snprintf(e, sizeof e, "%.1000s", s->err);
        return fail(s, SESS_EFAIL, "cannot open a cache with the snapshot's page size: %.1100s", e);
    }
    snap_identity id;
    snap_identity_of(s->f, s->msha, &id);
    int32_t *ids = NULL;
    int64_t n = 0;
    if (snap_restore(s->f, s->s, data, len, &id, &ids, &n, s->err, sizeof s->err)) return SESS_EFAIL;
    s->n_seq = 0;
    int bad = seq_add(s, ids, n);
    free(ids);
    if (bad) return fail(s, SESS_EFAIL, "out of memory");
    *n_tokens = n;
    return SESS_OK;
}

/* The document's text from its path, refused when it changed since the conversation began. */
static char *reload_document(session *s, const char *path, const char *want_sha, size_t *len, int *code)
{
    char *doc = load_document(s, path, len, code);
    if (!doc) return NULL;
    char sha[65];
    snap_sha256_bytes(doc, *len, sha);
    if (want_sha && *want_sha && strcmp(sha, want_sha) != 0) {
        free(doc);
        *code = SESS_EMISMATCH;
        fail(s, SESS_EMISMATCH, "%s has changed since the conversation began (sha256 %.12s..., now %.12s...): "
             "restore that file, or start a new conversation about it", path, want_sha, sha);
        return NULL;
    }
    *code = SESS_OK;
    return doc;
}

/* Prefill the conversation along path (texts; the last two are the last question and its answer)
 * after doc, now. */
static int replay_conversation(session *s, const char *doc, const sess_message *path, int n_path)
{
    size_t nn = 0, na = 0;
    int32_t *all = NULL, *ans = NULL;
    int rc = SESS_OK;
    if (n_path < 2) {
        if (prompt_document(s->m, gemma_turns(s), doc, &all, &nn, s->err, sizeof s->err)) return SESS_EFAIL;
    } else {
        const char **texts = malloc(sizeof *texts * (size_t)n_path);
        if (!texts) return fail(s, SESS_EFAIL, "out of memory");
        for (int i = 0; i < n_path; i++) texts[i] = path[i].text;
        /* the conversation up to the last question, then the last answer's text */
        const char *last = path[n_path - 1].text;
        int bad = prompt_conversation(s->m, s->chat, doc, texts, n_path - 2, path[n_path - 2].text, &all, &nn, s->err,
                                      sizeof s->err) ||
                  tok_encode(s->m->vocab, last, strlen(last), 0, 0, &ans, &na, s->err, sizeof s->err);
        free(texts);
        int32_t *joined = bad ? NULL : realloc(all, sizeof(int32_t) * (nn + na + 1));
        if (bad || !joined) {
            free(all);
            free(ans);
            return bad ? SESS_EFAIL : fail(s, SESS_EFAIL, "out of memory");
        }
        all = joined;
        memcpy(all + nn, ans, sizeof(int32_t) * na);
        nn += na;
        free(ans);
    }
    char key[256];
    prefill_key(s, key, sizeof key);
    note(s, "session %lld: no snapshot under %s, prefilling %zu tokens", (long long)s->sid, key, nn);
    fwd_rewind(s->f, 0);
    samp_reset(s->s);
    s->n_seq = 0;
    pol_set_probe_is_question(s->ps, n_path >= 2);
    if (seq_add(s, all, (int64_t)nn)) rc = fail(s, SESS_EFAIL, "out of memory");
    if (!rc) rc = eval(s, all, nn);
    free(all);
    if (rc) {
        fwd_rewind(s->f, 0);
        s->n_seq = 0;
    }
    return rc;
}

/* The newest usable snapshot on the branch before its last one (which is unusable: why), then the
 * turns after it evaluated from their texts. SESS_ENOTFOUND when no older snapshot restores. */
static int resume_from_older(session *s, int64_t sid, const sess_message *path, int n_path, const char *key,
                             const char *why)
{
    char e[1024];
    s->err[0] = 0;
    for (int j = n_path - 3; j >= 1; j -= 2) {
        if (strcmp(path[j].role, "assistant") != 0) continue;
        void *data = NULL;
        size_t len = 0;
        int64_t n = 0;
        if (s->db.get_snapshot(s->db.ud, path[j].id, key, &data, &len, e, sizeof e) != 0) continue;
        int bad = restore_snapshot(s, data, len, &n);
        free(data);
        if (bad) continue;
        /* the turns after it, as their texts tokenize: each question's continuation, then its answer */
        int64_t from = fwd_pos(s->f);
        int rc = SESS_OK;
        for (int i = j + 1; rc == SESS_OK && i + 1 < n_path; i += 2) {
            int32_t *q = NULL, *a = NULL;
            size_t nq = 0, na = 0;
            const char *ans = path[i + 1].text;
            if (prompt_continue(s->m, s->chat, path[i].text, &q, &nq, s->err, sizeof s->err) ||
                tok_encode(s->m->vocab, ans, strlen(ans), 0, 0, &a, &na, s->err, sizeof s->err) ||
                seq_add(s, q, (int64_t)nq) || seq_add(s, a, (int64_t)na))
                rc = s->err[0] ? SESS_EFAIL : fail(s, SESS_EFAIL, "out of memory");
            free(q);
            free(a);
        }
        note(s, "session %lld: the snapshot after the last answer is unusable (%.300s); restored the one after answer "
             "%d (%lld tokens) and prefilling the %d turns after it (%lld tokens)", (long long)sid, why, (j + 1) / 2,
             (long long)n, (n_path - 1 - j) / 2, (long long)(s->n_seq - from));
        if (rc == SESS_OK) rc = eval(s, s->seq + from, (size_t)(s->n_seq - from));
        return rc;
    }
    return SESS_ENOTFOUND;
}

int sess_resume(session *s, const char *key, const sess_resume_opts *o)
{
    static const sess_resume_opts none = { 0, 0, SESS_FORMAT_AUTO, NULL };
    if (!o) o = &none;
    if (!s->have_db) return fail(s, SESS_ENOTFOUND, "no session database: nothing to resume");
    sess_stored st;
    char e[1024];
    int f = s->db.find(s->db.ud, key, &st, e, sizeof e);
    if (f < 0) return fail(s, SESS_EFAIL, "%s", e);
    if (f == 1)
        return *key ? fail(s, SESS_ENOTFOUND, "no session '%s' (kvchat sessions list shows them)", key)
                    : fail(s, SESS_ENOTFOUND, "no sessions yet");
    if (strcmp(st.model_sha, s->msha) != 0)
        return fail(s, SESS_EMISMATCH, "session %lld was made with another model (%s)", (long long)st.id, st.model_path);
    char *given = NULL;
    size_t given_len = 0;
    if (o->doc_path) {
        char sha[65];
        int code;
        if (!(given = load_document(s, o->doc_path, &given_len, &code))) return code;
        snap_sha256_bytes(given, given_len, sha);
        if (strcmp(sha, st.doc_sha) != 0) {
            free(given);
            return fail(s, SESS_EMISMATCH, "session %lld is about %.250s, not %.500s (start another session for this "
                        "document)", (long long)st.id, st.doc_title, o->doc_path);
        }
    }
    int stored_chat = !strcmp(st.format, "chat");
    if (o->format != SESS_FORMAT_AUTO && o->format != stored_chat) {
        free(given);
        return fail(s, SESS_EMISMATCH, "session %lld writes its turns in the %s format", (long long)st.id, st.format);
    }
    int64_t leaf = 0;
    sess_message *path = NULL;
    int n_path = 0;
    if (s->db.latest(s->db.ud, st.id, &leaf, e, sizeof e) ||
        (leaf && s->db.path(s->db.ud, leaf, &path, &n_path, e, sizeof e))) {
        free(given);
        return fail(s, SESS_EFAIL, "%s", e);
    }
    /* a question left without an answer (an interrupted turn) is superseded by the next one */
    while (n_path > 0 && strcmp(path[n_path - 1].role, "assistant") != 0) {
        leaf = path[n_path - 1].parent;
        free(path[n_path - 1].text);
        n_path--;
    }
    if (o->take_policy) {
        /* the policy the conversation last answered under (its text carries its budget), else the
         * one it began with */
        const char *pol = n_path > 0 && path[n_path - 1].policy[0] ? path[n_path - 1].policy : st.policy;
        const char *bud = pol == st.policy ? st.budget : "";
        if (set_policy_text(s, pol, bud)) {
            free(given);
            sess_messages_free(path, n_path);
            return SESS_EFAIL;
        }
        snprintf(s->cfg.budget, sizeof s->cfg.budget, "%s", bud);
    }
    char k[256];
    prefill_key(s, k, sizeof k);
    void *data = NULL;
    size_t len = 0;
    int g = leaf ? s->db.get_snapshot(s->db.ud, leaf, k, &data, &len, e, sizeof e) : 1;
    if (g < 0) {
        free(given);
        sess_messages_free(path, n_path);
        return fail(s, SESS_EFAIL, "%s", e);
    }
    for (int i = 0; s->cb.past && i < n_path; i++) s->cb.past(s->cb.ud, path[i].role, path[i].text);
    reset_conversation(s);
    s->have_doc = 0;
    s->chat = stored_chat;
    s->sid = st.id;
    s->leaf = leaf;
    snprintf(s->doc_path, sizeof s->doc_path, "%s", st.doc_path);
    snprintf(s->doc_title, sizeof s->doc_title, "%s", st.doc_title);
    snprintf(s->doc_sha, sizeof s->doc_sha, "%s", st.doc_sha);
    snprintf(s->title, sizeof s->title, "%s", st.title);
    snprintf(s->name, sizeof s->name, "%s", st.name);
    int rc = SESS_OK, replayed = 0;   /* replayed: prefilled now, in whole or in part */
    if (g == 0) {
        double t0 = now_s();
        int64_t n = 0;
        rc = restore_snapshot(s, data, len, &n);
        if (rc) {
            /* the newest snapshot is unusable (corrupt, truncated): an older one on this branch and the
             * turns after it prefilled again, or else the whole conversation from its document */
            snprintf(e, sizeof e, "%.1000s", s->err);
            rc = resume_from_older(s, st.id, path, n_path, k, e);
            replayed = rc == SESS_OK;
            if (rc == SESS_ENOTFOUND) {
                note(s, "session %lld: the snapshot after the last answer is unusable (%.300s) and no older one is: "
                     "prefilling the conversation again", (long long)st.id, e);
                g = 1;
                rc = SESS_OK;
            }
        } else {
            s->resumed = 1;
            s->restore_ms = (now_s() - t0) * 1e3;
            /* the positions the cache holds, as the status bar counts the context */
            note(s, "session %lld: restored %lld tokens (%s) from a %.1f MiB snapshot in %.0f ms", (long long)st.id,
                 (long long)fwd_pos(s->f), k, (double)len / (1 << 20), s->restore_ms);
        }
    }
    if (g != 0) {
        /* no snapshot under this prefill policy: the document and the conversation are prefilled again */
        char *doc = given;
        size_t dl = given_len;
        given = NULL;
        if (!doc) doc = reload_document(s, st.doc_path, st.doc_sha, &dl, &rc);
        if (!doc) {
            /* rc set by reload_document */
        } else if (o->defer) {
            s->pending_doc = doc;
            doc = NULL;
            if (n_path > 0 && !(s->pending_turns = calloc((size_t)n_path, sizeof *s->pending_turns)))
                rc = fail(s, SESS_EFAIL, "out of memory");
            for (int i = 0; !rc && i < n_path; i++) {
                s->pending_turns[i] = path[i].text;   /* the texts move to the pending conversation */
                path[i].text = NULL;
                s->n_pending_turns++;
            }
        } else {
            rc = replay_conversation(s, doc, path, n_path);
            replayed = rc == SESS_OK;
        }
        free(doc);
    }
    if (replayed && leaf) {   /* filed under the last answer, so the next resume under this policy is instant */
        size_t sl;
        if (save_snapshot(s, leaf, &sl) == 0)
            note(s, "session %lld: its snapshot under %s is saved: the next resume is instant", (long long)st.id, k);
        else
            note(s, "session %lld: the snapshot could not be saved (%.600s)", (long long)st.id, s->err);
    }
    free(given);
    free(data);
    if (rc == SESS_OK) {
        s->turns = n_path / 2;
        s->turn_base = s->turns;
        s->have_doc = 1;
        if (!s->pending_doc) fwd_set_floor(s->f, fwd_pos(s->f));
    } else {
        reset_conversation(s);
        s->have_doc = 0;
    }
    sess_messages_free(path, n_path);
    return rc;
}

/* ---- regenerate, branch */

int sess_regenerate(session *s)
{
    if (s->turns == 0 || !s->last_q || s->ans_start < 1) return fail(s, SESS_ENOTFOUND, "nothing to regenerate yet");
    int64_t target = s->ans_start - 1;
    int64_t r = fwd_rewind(s->f, target);
    s->n_seq = s->seq_ans;
    int rc;
    if (r < target && (rc = eval(s, s->seq + r, (size_t)(target - r)))) return rc;   /* replay what was lost */
    int32_t prev = s->seq[target];
    if ((rc = eval(s, &prev, 1))) return rc;
    s->turns--;
    char *q = strdup(s->last_q);
    if (!q) return fail(s, SESS_EFAIL, "out of memory");
    rc = answer(s, q, prev, 1, 1, 0);
    free(q);
    return rc;
}

/* Question k (asked before this object's records) asked as text: the document and the conversation
 * before it come from the store and are prefilled again. */
static int branch_from_store(session *s, int k, const char *text)
{
    char e[1024];
    if (!s->have_db || !s->sid)
        return fail(s, SESS_ENOTFOUND, "this conversation is not saved: only questions asked in this window can be edited");
    if (!s->leaf) return fail(s, SESS_ENOTFOUND, "nothing saved yet");
    sess_message *path = NULL;
    int n_path = 0;
    if (s->db.path(s->db.ud, s->leaf, &path, &n_path, e, sizeof e)) return fail(s, SESS_EFAIL, "%s", e);
    int qi = 2 * (k - 1);
    if (qi >= n_path || strcmp(path[qi].role, "user") != 0) {
        sess_messages_free(path, n_path);
        return fail(s, SESS_ENOTFOUND, "question %d is not in the saved conversation", k);
    }
    size_t dl, n = 0;
    int32_t *ids = NULL;
    int rc;
    char *doc = reload_document(s, s->doc_path, s->doc_sha, &dl, &rc);
    const char **texts = doc ? malloc(sizeof *texts * (size_t)(qi + 1)) : NULL;
    if (!doc || !texts) {
        free(doc);
        sess_messages_free(path, n_path);
        return doc ? fail(s, SESS_EFAIL, "out of memory") : rc;
    }
    for (int i = 0; i < qi; i++) texts[i] = path[i].text;
    rc = prompt_conversation(s->m, s->chat, doc, texts, qi, text, &ids, &n, s->err, sizeof s->err) ? SESS_EFAIL : SESS_OK;
    free(texts);
    free(doc);
    int64_t parent = path[qi].parent;
    sess_messages_free(path, n_path);
    if (rc) return rc;
    note(s, "question %d edited: a new branch (the old one stays in the session); prefilling the document and the %d "
         "turns before it (%zu tokens)", k, k - 1, n);
    fwd_rewind(s->f, 0);
    samp_reset(s->s);
    s->n_seq = 0;
    pol_set_probe_is_question(s->ps, 1);
    double t0 = now_s();
    rc = seq_add(s, ids, (int64_t)n) ? fail(s, SESS_EFAIL, "out of memory") : eval(s, ids, n);
    if (rc) {
        free(ids);
        if (rc == SESS_ECANCELLED) snprintf(s->err, sizeof s->err, "cancelled; /resume continues the session");
        drop_document(s);
        return rc;
    }
    int32_t prev = ids[n - 1];
    free(ids);
    s->leaf = parent;
    s->turns = k - 1;
    s->turn_base = k - 1;
    s->n_turns_here = 0;
    s->pending_record = -1;
    return answer(s, text, prev, 0, (int64_t)n, now_s() - t0);
}

int sess_branch(session *s, int k, const char *question)
{
    if (!question || !*question) return fail(s, SESS_EFAIL, "the question is empty");
    if (k < 1 || k > s->turns)
        return fail(s, SESS_ENOTFOUND, "there is no question %d (this conversation has %lld)", k, (long long)s->turns);
    int64_t r = k - 1 - s->turn_base;
    if (r < 0 || r >= s->n_turns_here) return branch_from_store(s, k, question);
    int64_t pos = s->turn_pos[r];
    int64_t got = fwd_rewind(s->f, pos);
    s->n_seq = s->turn_seq[r];
    int rc;
    if (got < pos && (rc = eval(s, s->seq + got, (size_t)(pos - got)))) return rc;   /* replay what was lost */
    samp_load_state(s->s, s->turn_samp[r]);
    s->leaf = s->turn_parent[r];
    s->turns = s->turn_base + r;
    s->n_turns_here = (int)r;   /* later records belong to the old branch */
    note(s, "question %d edited: a new branch (the old one stays in the session)", k);
    int32_t prev;
    int64_t n = 0;
    double secs = 0;
    if ((rc = prepare_turn(s, question, &prev, &n, &secs))) return rc;
    return answer(s, question, prev, 0, n, secs);
}

/* ---- policies */

/* What a switch to spec with budget is checked against: the conversation as it is (the length a
 * prefill policy would rebuild, the cache a decode-time policy reads from the next answer), or the
 * whole context before a document is loaded; ask checks each turn the same way (prepare_turn). */
static int check_policy(session *s, const pol_spec *parsed)
{
    int64_t P = fwd_pos(s->f);
    int64_t len = s->have_doc && !s->pending_doc && P > 0 ? P : fwd_n_ctx(s->f);
    pol_env env;
    fwd_policy_env(s->f, &env);
    pol_set *probe = pol_set_create(parsed, &env, s->err, sizeof s->err);
    int bad = !probe || pol_set_check(probe, len, s->err, sizeof s->err);
    pol_set_free(probe);
    return bad ? SESS_EFAIL : SESS_OK;
}

/* spec as it is switched to: a budget given with it replaces the spec's own (buf holds the result). */
static const char *policy_text(const char *spec, const char *budget, char *buf, size_t cap)
{
    if (!budget) return spec;
    pol_strip_budget(spec, buf, cap);
    return buf;
}

int sess_check_policy(session *s, const char *spec, const char *budget)
{
    char buf[256];
    pol_spec parsed;
    const char *b = budget ? budget : s->cfg.budget;
    if (pol_parse(&parsed, policy_text(spec, budget, buf, sizeof buf), *b ? b : NULL, s->err, sizeof s->err))
        return SESS_EFAIL;
    return check_policy(s, &parsed);
}

int sess_set_policy(session *s, const char *spec_in, const char *budget)
{
    char oldkey[256], newkey[256], old[256], oldbudget[32], e[1024], buf[256];
    pol_spec parsed;
    const char *b = budget ? budget : s->cfg.budget;
    const char *spec = policy_text(spec_in, budget, buf, sizeof buf);
    if (pol_parse(&parsed, spec, *b ? b : NULL, s->err, sizeof s->err)) return SESS_EFAIL;
    /* every front end refuses the same specs and budgets, before anything changes */
    if (check_policy(s, &parsed)) return SESS_EFAIL;
    prefill_key(s, oldkey, sizeof oldkey);
    sess_prefill_key(&parsed, newkey, sizeof newkey);
    snprintf(old, sizeof old, "%s", pol_set_spec(s->ps)->text);
    snprintf(oldbudget, sizeof oldbudget, "%s", s->cfg.budget);
    int64_t P = fwd_pos(s->f);
    if (!s->have_doc || s->pending_doc || P == 0 || !strcmp(oldkey, newkey)) {
        /* the cache stays as it is: a decode-time policy reads it from the next answer on */
        if (set_policy_text(s, spec, b)) return SESS_EFAIL;
        snprintf(s->cfg.budget, sizeof s->cfg.budget, "%s", b);
        s->policy_pending = strcmp(old, pol_set_spec(s->ps)->text) != 0;
        note(s, "policy %s%s%s: from the next answer on%s", pol_set_spec(s->ps)->text, s->cfg.budget[0] ? ", budget " : "",
             s->cfg.budget, s->have_doc ? "" : " (a prefill policy acts when a document is opened)");
        return SESS_OK;
    }
    /* keep the current state to come back to */
    snap_identity id;
    snap_identity_of(s->f, s->msha, &id);
    void *keep = NULL, *data = NULL;
    size_t keep_len = 0, len = 0;
    if (snap_save(s->f, s->s, &id, s->seq, s->n_seq, &keep, &keep_len, s->err, sizeof s->err)) return SESS_EFAIL;
    int64_t n_seq = s->n_seq;
    void *s0 = malloc(samp_state_size());
    if (!s0) {
        free(keep);
        return fail(s, SESS_EFAIL, "out of memory");
    }
    if (set_policy_text(s, spec, b)) {
        free(s0);
        free(keep);
        return SESS_EFAIL;
    }
    snprintf(s->cfg.budget, sizeof s->cfg.budget, "%s", b);
    samp_save_state(s->s, s0);
    double t0 = now_s();
    int got = s->have_db && s->leaf ? s->db.get_snapshot(s->db.ud, s->leaf, newkey, &data, &len, e, sizeof e) : 1;
    int rc = SESS_OK;
    int64_t n = 0;
    if (got == 0 && restore_snapshot(s, data, len, &n) == 0) {
        note(s, "policy %s: this conversation's snapshot under %s restored (%lld tokens, %.1f MiB) in %.0f ms",
             pol_set_spec(s->ps)->text, newkey, (long long)fwd_pos(s->f), (double)len / (1 << 20), (now_s() - t0) * 1e3);
    } else {
        if (got == 0) note(s, "the snapshot under %s is not usable (%s); prefilling instead", newkey, s->err);
        note(s, "policy %s: no snapshot of this conversation under %s; prefilling its %lld tokens again",
             pol_set_spec(s->ps)->text, newkey, (long long)P);
        fwd_rewind(s->f, 0);
        pol_set_probe_is_question(s->ps, s->turns > 0);
        rc = eval(s, s->seq, (size_t)P);
        if (rc == SESS_OK) {
            samp_load_state(s->s, s0);   /* eval recorded the tokens again for the penalty */
            s->n_seq = n_seq;
            char d[1024];
            pol_set_describe(s->ps, d, sizeof d);
            note(s, "prefilled under %s in %.1f s%s%s", pol_set_spec(s->ps)->text, now_s() - t0, d[0] ? "; " : "", d);
            size_t sl;
            if (s->have_db && s->leaf && save_snapshot(s, s->leaf, &sl) == 0)
                note(s, "its snapshot is saved: switching back to %s later is instant", newkey);
        } else {
            snprintf(e, sizeof e, "%.1000s", s->err);
            fail(s, rc, "%s; back to %s", rc == SESS_ECANCELLED ? "prefill cancelled" : e, old);
        }
    }
    free(data);
    if (rc) {
        /* the old policy and its cache, exactly as they were */
        int64_t n_old = 0;
        snprintf(e, sizeof e, "%.1000s", s->err);
        snprintf(s->cfg.budget, sizeof s->cfg.budget, "%s", oldbudget);
        if (set_policy_text(s, old, oldbudget) || restore_snapshot(s, keep, keep_len, &n_old)) {
            fail(s, SESS_EFAIL, "%.500s; could not go back to %s (%.300s): open the document again", e, old, s->err);
            drop_document(s);
        } else {
            snprintf(s->err, sizeof s->err, "%s", e);
        }
    }
    /* where a regeneration rewinds to: before the last answer, or the document's end */
    if (s->have_doc) fwd_set_floor(s->f, s->turns > 0 && s->ans_start > 0 ? s->ans_start - 1 : fwd_pos(s->f));
    free(s0);
    free(keep);
    return rc;
}

void sess_set_sampling(session *s, const samp_params *sp, int64_t n_predict)
{
    samp_set_params(s->s, sp);
    s->cfg.sp = *sp;
    if (n_predict > 0) s->cfg.n_predict = n_predict;
}

/* ---- a comparison of decode-time policies */

int sess_compare(session *s, const char *const *specs_in, int n_in, const char *question, sess_compared *out,
                 int *n_out)
{
    char specs[8][256], key[256];
    *n_out = 0;
    if (n_in < 1 || n_in > 7) return fail(s, SESS_EFAIL, "compare up to 7 policies with the current one");
    if (s->pending_doc) return fail(s, SESS_EFAIL, "ask a first question before comparing policies");
    snprintf(specs[0], sizeof specs[0], "%s", pol_set_spec(s->ps)->text);
    int n_spec = 1;
    /* each compared policy keeps the cache's prefill policy: only the decode-time part varies; a
     * prefill policy that also acts while decoding would change the cache under the comparison */
    prefill_key(s, key, sizeof key);
    if (!strncmp(key, "h2o", 3) || !strncmp(key, "chelsea", 7))
        return fail(s, SESS_EFAIL, "compare needs a cache that decoding leaves alone: not under h2o or chelsea");
    for (int i = 0; i < n_in; i++) {
        pol_spec ps;
        if (pol_parse(&ps, specs_in[i], NULL, s->err, sizeof s->err)) return SESS_EFAIL;
        for (int k = 0; k < ps.n; k++)
            if (ps.ops[k]->stage == POL_STAGE_PREFILL)
                return fail(s, SESS_EFAIL,
                            "compare decode-time policies (chess, quest, sentkv, streaming, full) on the cache as it is");
        char joined[256];
        if (strcmp(key, "full") != 0)
            snprintf(joined, sizeof joined, "%.120s+%.120s", key, specs_in[i]);
        else
            snprintf(joined, sizeof joined, "%s", specs_in[i]);
        /* by the canonical text: "quest" and the current "quest" (or "full" under full) run once */
        pol_spec canon;
        if (pol_parse(&canon, joined, NULL, s->err, sizeof s->err)) return SESS_EFAIL;
        int dup = 0;
        for (int j = 0; j < n_spec; j++) dup |= !strcmp(specs[j], canon.text);
        if (!dup) snprintf(specs[n_spec++], sizeof specs[0], "%s", canon.text);
    }
    if (n_spec == 1)
        return fail(s, SESS_EFAIL, "nothing to compare: %s is the current policy (name another decode-time policy)",
                    specs[0]);
    int64_t turn_start = fwd_pos(s->f), seq0 = s->n_seq, turns0 = s->turns;
    int32_t prev;
    size_t ss = samp_state_size();
    void *s0 = malloc(ss), *s1 = malloc(ss);
    size_t nv = (size_t)s->m->hp.n_vocab;
    float *l0 = malloc(sizeof(float) * nv);
    if (!s0 || !s1 || !l0) {
        free(s0);
        free(s1);
        free(l0);
        return fail(s, SESS_EFAIL, "out of memory");
    }
    samp_save_state(s->s, s0);
    int64_t n_eval;
    double secs;
    int rc = prepare_turn(s, question, &prev, &n_eval, &secs);
    s->pending_record = -1;   /* a side query is no turn of the conversation */
    if (rc) {
        free(s0);
        free(s1);
        free(l0);
        return rc;
    }
    int64_t p_ans = fwd_pos(s->f);
    memcpy(l0, s->logits, sizeof(float) * nv);
    samp_save_state(s->s, s1);
    fwd_set_floor(s->f, p_ans);
    pol_set *orig = s->ps;   /* the conversation's own policies stay untouched */
    pol_env env;
    fwd_policy_env(s->f, &env);
    for (int i = 0; i < n_spec && !cancelled(s); i++) {
        pol_spec spec;
        pol_set *ps_i = pol_parse(&spec, specs[i], NULL, s->err, sizeof s->err)
                            ? NULL
                            : pol_set_create(&spec, &env, s->err, sizeof s->err);
        if (!ps_i) {
            rc = SESS_EFAIL;
            break;
        }
        fwd_set_policy(s->f, ps_i);
        if (fwd_rewind(s->f, p_ans) != p_ans) {
            fwd_set_policy(s->f, orig);
            pol_set_free(ps_i);
            rc = fail(s, SESS_EFAIL, "the cache could not go back to the question's end");
            break;
        }
        memcpy(s->logits, l0, sizeof(float) * nv);
        samp_load_state(s->s, s1);
        gen_result gr;
        double t0 = now_s();
        sess_callbacks keepcb = s->cb;
        s->cb.text = NULL;   /* a compared answer is collected, not streamed: its progress is counted */
        s->cb.event = NULL;
        s->cb.page = NULL;
        s->column = i;
        s->n_columns = n_spec;
        s->column_policy = specs[i];
        if (keepcb.column) keepcb.column(keepcb.ud, i, n_spec, specs[i], 0);
        rc = generate(s, prev, s->cfg.n_predict, 0, 0, 1, &gr);
        s->cb = keepcb;
        s->column = -1;
        fwd_set_policy(s->f, orig);
        if (rc) {
            pol_set_free(ps_i);
            break;
        }
        const pol_step_stats *st = pol_set_stats(ps_i);
        double denom = (double)st->steps * env.n_global * env.n_head_kv;
        sess_compared *c = &out[(*n_out)++];
        snprintf(c->policy, sizeof c->policy, "%.250s", specs[i]);
        c->text = strdup(s->answer ? s->answer : "");
        c->n_tokens = gr.n_gen;
        c->seconds = now_s() - t0;
        c->pages_per_step = denom > 0 ? (double)st->pages_sum / denom : 0.0;
        c->kv_read_per_step = st->steps ? (double)st->bytes_touched_total / (double)st->steps : 0.0;
        c->events = gr.events;
        pol_set_free(ps_i);
    }
    /* the conversation goes on as before the comparison (replaying the sequence if the
     * sliding-window layers no longer hold what the turn's start needs) */
    fwd_set_policy(s->f, orig);
    int64_t r = fwd_rewind(s->f, turn_start);
    s->n_seq = seq0;
    s->turns = turns0;
    int rr = r < turn_start ? eval(s, s->seq + r, (size_t)(turn_start - r)) : SESS_OK;
    fwd_set_floor(s->f, s->turns > 0 ? s->ans_start - 1 : turn_start);   /* where a regeneration rewinds to */
    samp_load_state(s->s, s0);
    answer_reset(s);
    free(l0);
    free(s0);
    free(s1);
    if (!rc && rr) rc = rr;
    return rc;
}

/* ---- what the model sees */

void sess_spans_free(sess_span *sp, int n)
{
    for (int i = 0; sp && i < n; i++) free(sp[i].text);
    free(sp);
}

int sess_seen(session *s, sess_span **out, int *n_out)
{
    *out = NULL;
    *n_out = 0;
    int64_t n = s->n_seq;
    char *state = calloc((size_t)(n > 0 ? n : 1), 1);
    if (!state) return fail(s, SESS_EFAIL, "out of memory");
    pol_env env;
    fwd_policy_env(s->f, &env);
    if (env.n_global > 0) {
        int il = env.global[0];
        const kv_cache *kv = fwd_kv(s->f);
        for (int i = 0; i < kv_n_pages(kv, il, 0); i++) {
            const kv_page *p = kv_layer_page(kv, il, 0, i);
            for (int32_t t = 0; t < p->n; t++)
                if (p->pos[t] >= 0 && p->pos[t] < n) state[p->pos[t]] = 1;
        }
        int nl;
        const int *last = pol_set_last_pages(s->ps, &nl);
        for (int k = 0; k < nl; k++) {
            if (last[k] >= kv_n_pages(kv, il, 0)) continue;
            const kv_page *p = kv_layer_page(kv, il, 0, last[k]);
            for (int32_t t = 0; t < p->n; t++)
                if (p->pos[t] >= 0 && p->pos[t] < n) state[p->pos[t]] = 2;
        }
    } else {
        memset(state, 1, (size_t)n);
    }
    sess_span *sp = NULL;
    int ns = 0, cap = 0, rc = SESS_OK;
    tok_stream ts;
    tok_stream_init(&ts, s->m->vocab);
    char piece[512];
    for (int64_t i = 0; i < n && rc == SESS_OK; i++) {
        size_t k = tok_stream_feed(&ts, s->seq[i], piece, sizeof piece - 1);
        if (i == n - 1) k += tok_stream_flush(&ts, piece + k, sizeof piece - 1 - k);
        if (k == 0) continue;
        piece[k] = 0;
        if (ns == 0 || sp[ns - 1].state != state[i]) {
            if (ns == cap) {
                cap = cap ? cap * 2 : 64;
                sess_span *nsp = realloc(sp, sizeof *nsp * (size_t)cap);
                if (!nsp) {
                    rc = fail(s, SESS_EFAIL, "out of memory");
                    break;
                }
                sp = nsp;
            }
            sp[ns].state = state[i];
            if (!(sp[ns].text = strdup(piece))) rc = fail(s, SESS_EFAIL, "out of memory");
            ns++;
        } else {
            size_t a = strlen(sp[ns - 1].text);
            char *nt = realloc(sp[ns - 1].text, a + k + 1);
            if (!nt) {
                rc = fail(s, SESS_EFAIL, "out of memory");
                break;
            }
            memcpy(nt + a, piece, k + 1);
            sp[ns - 1].text = nt;
        }
    }
    free(state);
    if (rc) {
        sess_spans_free(sp, ns);
        return rc;
    }
    *out = sp;
    *n_out = ns;
    return SESS_OK;
}

/* ---- lower level */

int sess_feed(session *s, const int32_t *ids, int64_t n, fwd_logits_fn each, void *ud)
{
    if (n <= 0) return fail(s, SESS_EFAIL, "nothing to evaluate");
    if (fwd_pos(s->f) + n + 1 > fwd_n_ctx(s->f))
        return fail(s, SESS_ENOFIT, "%lld tokens do not fit: %lld of the context's %lld are used", (long long)n,
                    (long long)fwd_pos(s->f), (long long)fwd_n_ctx(s->f));
    int64_t n0 = s->n_seq;
    if (seq_add(s, ids, n)) return fail(s, SESS_EFAIL, "out of memory");
    for (int64_t i = 0; i < n; i++) samp_accept(s->s, ids[i]);
    if (fwd_eval(s->f, ids, n, s->logits, each, ud, s->cb.progress, s->cb.ud, s->abort_flag, s->err, sizeof s->err)) {
        s->n_seq = n0;
        return cancelled(s) ? fail(s, SESS_ECANCELLED, "cancelled") : SESS_EFAIL;
    }
    return SESS_OK;
}

int sess_rewind(session *s, int64_t pos)
{
    if (pos < 0 || pos > fwd_pos(s->f)) return fail(s, SESS_EFAIL, "cannot rewind to %lld", (long long)pos);
    int64_t r = fwd_rewind(s->f, pos);
    if (s->n_seq > pos) s->n_seq = pos;
    if (r < pos) {
        if (fwd_eval(s->f, s->seq + r, pos - r, s->logits, NULL, NULL, NULL, NULL, s->abort_flag, s->err, sizeof s->err))
            return cancelled(s) ? fail(s, SESS_ECANCELLED, "cancelled") : SESS_EFAIL;
    }
    return SESS_OK;
}

int sess_generate(session *s, int64_t n_predict, gen_result *res)
{
    if (s->n_seq == 0) return fail(s, SESS_EFAIL, "nothing was fed to continue from");
    int32_t prev = s->seq[s->n_seq - 1];
    memset(res, 0, sizeof *res);
    int rc = generate(s, prev, n_predict > 0 ? n_predict : s->cfg.n_predict, s->backtrack, 1, 0, res);
    s->last.gen = *res;
    s->last.text = s->answer ? s->answer : "";
    s->last.ids = s->ans_ids;
    s->last.n_ids = s->ans_n;
    return rc;
}

/* ---- accessors */

const sess_answer *sess_last_answer(const session *s) { return &s->last; }
const model *sess_model(const session *s) { return s->m; }
const fwd_ctx *sess_fwd(const session *s) { return s->f; }
fwd_ctx *sess_fwd_mut(session *s) { return s->f; }
const pol_set *sess_policies(const session *s) { return s->ps; }
const unc_monitor *sess_monitor(const session *s) { return s->mon; }
unc_monitor *sess_monitor_mut(session *s) { return s->mon; }
const samp *sess_sampler(const session *s) { return s->s; }
be_backend *sess_backend(const session *s) { return s->b; }
float *sess_logits(session *s) { return s->logits; }
const int32_t *sess_tokens(const session *s, int64_t *n)
{
    *n = s->n_seq;
    return s->seq;
}
int sess_backtrack(const session *s) { return s->backtrack; }
const unc_thresholds *sess_thresholds(const session *s) { return &s->cfg.thr; }
int sess_format(const session *s) { return s->chat; }
int64_t sess_turns(const session *s) { return s->turns; }
int sess_have_document(const session *s) { return s->have_doc; }
const char *sess_document_title(const session *s) { return s->doc_title; }
const char *sess_title(const session *s) { return s->title; }
int64_t sess_document_tokens(const session *s) { return s->doc_tokens; }
int64_t sess_stored_id(const session *s) { return s->sid; }
const char *sess_budget(const session *s) { return s->cfg.budget; }
int64_t sess_n_predict(const session *s) { return s->cfg.n_predict; }
int64_t sess_answer_tokens(const session *s) { return s->ans_n; }
int sess_policy_pending(const session *s) { return s->policy_pending; }
const char *sess_model_sha(const session *s) { return s->msha; }
