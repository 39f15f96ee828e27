/* session.c - one conversation about a document over a run (see session.h): the object, where it
 * reports, the store it saves to, switching and checking policies, sampling settings, the decision
 * trace, lower-level feeding, and what it holds. The rest is one file per concept: sess_store.c,
 * sess_doc.c, sess_turns.c, sess_resume.c, sess_compare.c (sess_priv.h says how they depend). */
#include <stdlib.h>
#include <string.h>

#include "engine/prompt.h"
#include "engine/sess_doc.h"
#include "engine/sess_reuse.h"
#include "engine/sess_store.h"
#include "engine/sess_turns.h"
#include "engine/tokenizer.h"

static void resolve_backtrack(session *s)
{
    s->backtrack = s->cfg.backtrack >= 0 ? s->cfg.backtrack : run_default_backtrack(s->r);
}

session *sess_create(run *r, const sess_config *cfg, char *err, size_t errlen)
{
    session *s = calloc(1, sizeof *s);
    if (!s) {
        run_free(r);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->r = r;
    s->cfg = *cfg;
    if (s->cfg.n_predict <= 0) s->cfg.n_predict = 128;
    s->abort_flag = &s->never;
    s->pending_record = -1;
    resolve_backtrack(s);
    const model *m = run_model(r);
    s->chat = cfg->format == SESS_FORMAT_AUTO ? prompt_has_template(m) : cfg->format;
    for (int32_t i = 0; i < tok_n_vocab(m->vocab); i++) {
        const char *p = tok_piece(m->vocab, i);
        int l = p ? (int)strlen(p) : 0;
        if (l > s->max_piece) s->max_piece = l;
    }
    if (s->max_piece < 1) s->max_piece = 1;
    return s;
}

void sess_free(session *s)
{
    if (!s) return;
    sess_clear_pending(s);
    run_free(s->r);
    free(s->answer);
    free(s->ans_ids);
    free(s->last_q);
    free(s->trace_text);
    for (int i = 0; i < SESS_MAX_TURNS; i++) free(s->turn_samp[i]);
    free(s);
}

const char *sess_error(const session *s) { return s->err; }

void sess_set_callbacks(session *s, const sess_callbacks *cb, volatile sig_atomic_t *abort_flag)
{
    if (cb)
        s->cb = *cb;
    else
        memset(&s->cb, 0, sizeof s->cb);
    s->abort_flag = abort_flag ? abort_flag : &s->never;
    run_set_progress(s->r, s->cb.progress, s->cb.ud);
    run_set_abort(s->r, abort_flag);
}

int sess_attach_store(session *s, const sess_persist *db)
{
    s->have_db = 0;
    s->msha[0] = 0;
    if (!db) return SESS_OK;
    const model *m = run_model(s->r);
    if (db->model(db->ud, m->path, m, s->msha, s->err, sizeof s->err)) return SESS_EFAIL;
    s->db = *db;
    s->have_db = 1;
    return SESS_OK;
}

/* ---- the decision trace */

int sess_trace(session *s, const char *text)
{
    free(s->trace_text);
    s->trace_text = NULL;
    s->trace_lo = s->trace_hi = 0;
    if (text && !(s->trace_text = strdup(text))) return sess_fail(s, SESS_EFAIL, "out of memory");
    return SESS_OK;
}

const char *sess_trace_text(const session *s, int64_t *lo, int64_t *hi)
{
    *lo = s->trace_lo;
    *hi = s->trace_hi;
    return pol_set_trace_text(run_policies(s->r));
}

/* ---- policies */

/* spec_text with budget (NULL or "": each policy's own) replaces the policies. */
static int set_policy_text(session *s, const char *spec_text, const char *budget)
{
    pol_spec spec;
    if (pol_parse(&spec, spec_text, budget && *budget ? budget : NULL, s->err, sizeof s->err) ||
        run_set_policy(s->r, &spec, s->err, sizeof s->err))
        return SESS_EFAIL;
    resolve_backtrack(s);
    return SESS_OK;
}

/* What a switch to spec with budget is checked against: the conversation as it is (the length a
 * prefill policy would rebuild, the cache a decode-time policy reads from the next answer), or the
 * whole context before a document is loaded; ask checks each turn the same way (sess_prepare_turn). */
static int check_policy(session *s, const pol_spec *parsed)
{
    int64_t P = run_pos(s->r);
    /* the conversation as it is, else a document waiting for its question (at least its tokens),
     * else the context */
    int64_t len = !s->have_doc                ? run_n_ctx(s->r)
                  : !s->pending_doc && P > 0  ? P
                  : s->doc_tokens > 0         ? s->doc_tokens
                                              : run_n_ctx(s->r);
    return run_check_policy(s->r, parsed, len, s->err, sizeof s->err);
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

/* The cache under the policies just switched to (newkey their prefill key): this conversation's
 * snapshot under them when the store has one, else the sequence prefilled again (its sampler state
 * s0 kept). */
static int rebuild_cache(session *s, const char *newkey, const void *s0)
{
    int64_t P = run_pos(s->r), n_ids;
    double t0 = run_clock_s();
    const char *now = pol_set_spec(run_policies(s->r))->text;
    /* this point's snapshot under the new policy, else an older state under it (an earlier answer's
     * snapshot, or the document's) and the tokens after it: what the conversation read under it
     * before is not read again */
    const int32_t *ids = run_tokens(s->r, &n_ids);
    int32_t *want = malloc(sizeof(int32_t) * (size_t)(n_ids > 0 ? n_ids : 1));
    if (!want) return sess_fail(s, SESS_EFAIL, "out of memory");
    memcpy(want, ids, sizeof(int32_t) * (size_t)n_ids);
    sess_rebuilt rb;
    int rc = sess_rebuild_from_stored(s, s->leaf, want, n_ids, P, &rb);
    if (rc == SESS_OK && rb.at_leaf && rb.from == n_ids) {   /* this very point: nothing to read or save */
        free(want);
        sess_note(s, "policy %s: this conversation's snapshot under %s restored (%lld tokens, %.1f MiB) in %.0f ms", now,
                  newkey, (long long)run_pos(s->r), (double)rb.bytes / (1 << 20), (run_clock_s() - t0) * 1e3);
        return SESS_OK;
    }
    if (rc == SESS_OK) {
        free(want);
        run_load_sampler(s->r, s0);
        char what[64] = "the document's snapshot";
        if (rb.answer) snprintf(what, sizeof what, "the snapshot after answer %d", rb.answer);
        sess_note(s, "policy %s: %s under %s restored (%lld tokens) and the %lld after it read, in %.1f s", now, what,
                  newkey, (long long)rb.from, (long long)(P - rb.from), run_clock_s() - t0);
        size_t sl;
        if (s->have_db && s->leaf && sess_save_snapshot(s, s->leaf, &sl) == 0)
            sess_note(s, "its snapshot is saved: switching back to %s later is instant", newkey);
        return SESS_OK;
    }
    if (rc != 1) {   /* the caller puts the old policy and cache back */
        free(want);
        return rc;
    }
    /* nothing stored: the whole sequence read again, its waiting ids waiting as before */
    sess_note(s, "policy %s: no snapshot of this conversation under %s; prefilling its %lld tokens again", now, newkey,
              (long long)P);
    run_set_question(s->r, 0);   /* the sequence read again: whatever it ends with */
    rc = run_append(s->r, want, P, s->err, sizeof s->err) ? SESS_EFAIL : run_feed(s->r, NULL, 0, NULL, NULL, s->err,
                                                                                 sizeof s->err);
    if (!rc && n_ids > P && run_append(s->r, want + P, n_ids - P, s->err, sizeof s->err)) rc = SESS_EFAIL;
    free(want);
    if (rc) return rc;
    run_load_sampler(s->r, s0);
    char d[1024];
    pol_set_describe(run_policies(s->r), d, sizeof d);
    sess_note(s, "prefilled under %s in %.1f s%s%s", now, run_clock_s() - t0, d[0] ? "; " : "", d);
    size_t sl;
    if (s->have_db && s->leaf && sess_save_snapshot(s, s->leaf, &sl) == 0)
        sess_note(s, "its snapshot is saved: switching back to %s later is instant", newkey);
    return SESS_OK;
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
    sess_current_prefill_key(s, oldkey, sizeof oldkey);
    sess_prefill_key(&parsed, newkey, sizeof newkey);
    snprintf(old, sizeof old, "%s", pol_set_spec(run_policies(s->r))->text);
    snprintf(oldbudget, sizeof oldbudget, "%s", s->cfg.budget);
    if (!s->have_doc || s->pending_doc || run_pos(s->r) == 0 || !strcmp(oldkey, newkey)) {
        /* the cache stays as it is: a decode-time policy reads it from the next answer on */
        if (set_policy_text(s, spec, b)) return SESS_EFAIL;
        snprintf(s->cfg.budget, sizeof s->cfg.budget, "%s", b);
        const char *now = pol_set_spec(run_policies(s->r))->text;
        s->policy_pending = strcmp(old, now) != 0;
        sess_note(s, "policy %s%s%s: from the next answer on%s", now, s->cfg.budget[0] ? ", budget " : "", s->cfg.budget,
                  s->have_doc ? "" : " (a prefill policy acts when a document is opened)");
        return SESS_OK;
    }
    if (s->turns == 0 && !s->leaf && sess_prefill_waits_for_question(newkey) && strcmp(s->doc_path, "-") != 0) {
        /* no question yet: like a document opened under this policy, it waits for the first question
         * and is compressed with it in view (as `ask` does), rather than for the document's end */
        size_t dl;
        int code;
        char *doc = sess_reload_document(s, s->doc_path, s->doc_sha, &dl, &code);
        if (!doc) return code;
        if (set_policy_text(s, spec, b)) {
            free(doc);
            return SESS_EFAIL;
        }
        snprintf(s->cfg.budget, sizeof s->cfg.budget, "%s", b);
        char e2[64];
        run_rewind(s->r, 0, 0, e2, sizeof e2);
        run_reset_sampler(s->r);
        s->pending_doc = doc;
        s->policy_pending = 0;
        sess_note_waiting(s, newkey);
        return SESS_OK;
    }
    /* keep the current state to come back to */
    void *keep = NULL, *s0 = malloc(run_sampler_state_size(s->r));
    size_t keep_len = 0;
    if (!s0) return sess_fail(s, SESS_EFAIL, "out of memory");
    if (run_snapshot(s->r, s->msha, &keep, &keep_len, s->err, sizeof s->err) || set_policy_text(s, spec, b)) {
        free(s0);
        free(keep);
        return SESS_EFAIL;
    }
    snprintf(s->cfg.budget, sizeof s->cfg.budget, "%s", b);
    run_save_sampler(s->r, s0);
    int rc = rebuild_cache(s, newkey, s0);
    if (rc) {
        /* the old policy and its cache, exactly as they were */
        snprintf(e, sizeof e, "%.1000s", s->err);
        sess_fail(s, rc, "%s; back to %s", rc == SESS_ECANCELLED ? "prefill cancelled" : e, old);
        snprintf(e, sizeof e, "%.1000s", s->err);
        snprintf(s->cfg.budget, sizeof s->cfg.budget, "%s", oldbudget);
        if (set_policy_text(s, old, oldbudget) || run_restore(s->r, keep, keep_len, s->msha, s->err, sizeof s->err)) {
            sess_fail(s, SESS_EFAIL, "%.500s; could not go back to %s (%.300s): open the document again", e, old, s->err);
            sess_drop_document(s);
        } else {
            run_place(s->r);
            snprintf(s->err, sizeof s->err, "%s", e);
        }
    }
    if (s->have_doc) sess_set_regen_floor(s);
    free(s0);
    free(keep);
    return rc;
}

void sess_set_sampling(session *s, const samp_params *sp, int64_t n_predict)
{
    run_set_sampling(s->r, sp);
    if (n_predict > 0) s->cfg.n_predict = n_predict;
}

/* ---- lower level */

int sess_feed(session *s, const int32_t *ids, int64_t n, fwd_logits_fn each, void *ud)
{
    if (n <= 0) return sess_fail(s, SESS_EFAIL, "nothing to evaluate");
    return run_feed(s->r, ids, n, each, ud, s->err, sizeof s->err);
}

int sess_rewind(session *s, int64_t pos)
{
    if (pos < 0 || pos > run_pos(s->r)) return sess_fail(s, SESS_EFAIL, "cannot rewind to %lld", (long long)pos);
    int64_t n = sess_seq_len(s);
    return run_rewind(s->r, pos, n < pos ? n : pos, s->err, sizeof s->err);
}

int sess_generate(session *s, int64_t n_predict, gen_result *res)
{
    memset(res, 0, sizeof *res);
    int rc = sess_generate_into(s, n_predict > 0 ? n_predict : s->cfg.n_predict, s->backtrack, 1, 0, res);
    s->last.gen = *res;
    s->last.text = s->answer ? s->answer : "";
    s->last.ids = s->ans_ids;
    s->last.n_ids = s->ans_n;
    return rc;
}

/* ---- what the session holds */

const run *sess_run(const session *s) { return s->r; }
const char *sess_load_note(const session *s) { return run_load_note(s->r); }
const char *sess_warning(const session *s) { return run_warning(s->r); }
const sess_answer *sess_last_answer(const session *s) { return &s->last; }
int sess_backtrack(const session *s) { return s->backtrack; }
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
