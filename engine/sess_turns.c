/* sess_turns.c - a session's turns (see sess_turns.h and sess_ask, sess_regenerate, sess_branch in
 * session.h): the question's tokens, the answer streamed as its text becomes final, the turn
 * saved; the last answer again; a question asked again as a new branch from where it was asked. */
#include "engine/sess_turns.h"

#include <stdlib.h>
#include <string.h>

#include "engine/prompt.h"
#include "engine/sess_doc.h"
#include "engine/sess_store.h"
#include "engine/tokenizer.h"

/* ---- the answer as it is generated */

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

void sess_answer_reset(session *s)
{
    s->ans_len = 0;
    if (s->answer) s->answer[0] = 0;
    s->ans_n = 0;
}

typedef struct stream {
    session *s;
    tok_stream ts;
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
    if (n && s->cb.text) s->cb.text(s->cb.ud, piece, n);
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

int sess_stops(const session *s, int answering, const char **out, int max)
{
    /* the plain form's own ends (prompt.c): a base model goes on writing past its answer */
    int n = answering && !s->chat ? prompt_plain_stops(s->cfg.answer_end, out, max) : 0;
    for (int i = 0; i < s->cfg.n_stop && n < max; i++)
        if (s->cfg.stop[i][0]) out[n++] = s->cfg.stop[i];
    return n;
}

int sess_generate_into(session *s, int64_t n_predict, int max_regen, int keep, int answering, gen_result *gr)
{
    sess_answer_reset(s);
    stream st = { s, { 0 } };
    tok_stream_init(&st.ts, run_model(s->r)->vocab);
    const char *stops[SESS_MAX_STOP + 2];
    int n_stop = sess_stops(s, answering, stops, SESS_MAX_STOP + 2);
    run_answer_opts ao = { n_predict, keep, max_regen, 1, s->cfg.monitor || s->cb.page != NULL, stops, n_stop };
    gen_callbacks cb = { &st, on_token, on_page, on_event };
    int rc = run_answer(s->r, &ao, &cb, gr, s->err, sizeof s->err);
    /* what the detokenizer still holds is final too (also after an interrupt) */
    char piece[512];
    size_t k = tok_stream_flush(&st.ts, piece, sizeof piece - 1);
    answer_add(s, piece, k);
    if (k && s->cb.text) s->cb.text(s->cb.ud, piece, k);
    return rc;
}

/* ---- a turn */

/* The answer to question (its prompt is evaluated: the logits are ready), then the turn saved. */
static int answer(session *s, const char *question, int regen, int64_t prompt_tokens, double prefill_s)
{
    sess_answer *a = &s->last;
    memset(a, 0, sizeof *a);
    a->prompt_tokens = prompt_tokens;
    a->prefill_s = prefill_s;
    a->resumed = s->resumed;
    a->restore_ms = s->restore_ms;
    s->resumed = 0;
    s->ans_start = a->prompt_end = run_pos(s->r);
    s->seq_ans = sess_seq_len(s);
    run_set_floor(s->r, s->ans_start - 1);   /* a regeneration rewinds here exactly */
    s->policy_pending = 0;
    /* the question is in the store before a token is generated: a process killed mid-answer keeps it
     * (a failure here is tried again with the answer, by sess_save_turn) */
    if (!regen) sess_save_question(s, question);
    double t0 = run_clock_s();
    int rc = sess_generate_into(s, s->cfg.n_predict, s->backtrack, 1, 1, &a->gen);
    if (rc) {
        s->pending_record = -1;
        return rc;
    }
    a->decode_s = run_clock_s() - t0;
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
    return sess_save_turn(s, question, regen);
}

/* Where the turn about to be asked begins, for sess_branch; a full table stops recording. */
static void record_turn_start(session *s)
{
    s->pending_record = -1;
    int r = s->n_turns_here;
    if (r >= SESS_MAX_TURNS || (!s->turn_samp[r] && !(s->turn_samp[r] = malloc(run_sampler_state_size(s->r))))) return;
    s->turn_pos[r] = run_pos(s->r);
    s->turn_seq[r] = sess_seq_len(s);
    s->turn_parent[r] = s->leaf;
    run_save_sampler(s->r, s->turn_samp[r]);
    s->pending_record = r;
}

/* The trace of the next evaluation follows the traced text's first place in the sequence. */
static int start_trace(session *s)
{
    if (!s->trace_text) return SESS_OK;
    int64_t lo, hi, n;
    const int32_t *seq = run_tokens(s->r, &n);
    if (tok_find_text(run_model(s->r)->vocab, seq, (size_t)n, s->trace_text, &lo, &hi))
        return sess_fail(s, SESS_EFAIL, "the traced text '%.200s' is not in the prompt", s->trace_text);
    if (run_trace(s->r, lo, hi, s->err, sizeof s->err)) return SESS_EFAIL;
    s->trace_lo = lo;
    s->trace_hi = hi;
    return SESS_OK;
}

/* ids join the sequence after its first keep ids and everything the cache lacks is evaluated, with
 * the trace started and the probe being a question. On failure the sequence keeps its first keep. */
static int evaluate_prompt(session *s, int64_t keep, const int32_t *ids, size_t n, int64_t n_question, int64_t *n_eval,
                           double *secs)
{
    int64_t from = run_pos(s->r);
    if (run_append(s->r, ids, (int64_t)n, s->err, sizeof s->err)) return SESS_EFAIL;
    int rc = start_trace(s);
    if (!rc) {
        run_set_question(s->r, n_question);
        double t0 = run_clock_s();
        rc = run_feed(s->r, NULL, 0, NULL, NULL, s->err, sizeof s->err);
        *secs = run_clock_s() - t0;
    }
    if (rc) {
        char e[64];
        run_rewind(s->r, run_pos(s->r), keep, e, sizeof e);   /* the turn did not happen */
        return rc;
    }
    *n_eval = run_pos(s->r) - from;
    return SESS_OK;
}

int sess_prepare_turn(session *s, const char *question, int64_t *n_eval, double *secs)
{
    const model *m = run_model(s->r);
    int32_t *ids = NULL;
    size_t n = 0;
    int bad = s->turns > 0 ? prompt_continue(m, s->chat, question, &ids, &n, s->err, sizeof s->err)
                           : prompt_first_question(m, sess_gemma_turns(s), s->have_doc, question, &ids, &n, s->err,
                                                   sizeof s->err);
    if (bad) return SESS_EFAIL;
    int64_t n_seq0 = sess_seq_len(s), total = n_seq0 + (int64_t)n;
    if (total + 1 > run_n_ctx(s->r)) {
        free(ids);
        return sess_fail(s, SESS_ENOFIT, "the conversation and question are %lld tokens, longer than the context of "
                         "%lld tokens", (long long)total, (long long)run_n_ctx(s->r));
    }
    if (run_check_budget(s->r, total, s->err, sizeof s->err)) {
        free(ids);
        return SESS_EFAIL;
    }
    record_turn_start(s);
    int rc = evaluate_prompt(s, n_seq0, ids, n, (int64_t)n, n_eval, secs);   /* the turn's ids ask the question */
    free(ids);
    if (rc) s->pending_record = -1;
    return rc;
}

/* A deferred document (and, resumed without a snapshot, the conversation so far) with question,
 * prefilled together so the prefill policies see the question. */
static int prepare_pending(session *s, const char *question, int64_t *n_eval, double *secs)
{
    int32_t *ids = NULL;
    size_t n = 0;
    if (prompt_conversation(run_model(s->r), s->chat, s->pending_doc, (const char *const *)s->pending_turns,
                            s->n_pending_turns, question, &ids, &n, s->err, sizeof s->err))
        return SESS_EFAIL;
    if ((int64_t)n + 1 > run_n_ctx(s->r)) {
        free(ids);
        return sess_fail(s, SESS_ENOFIT, "the %s and question are %zu tokens, longer than the context of %lld tokens",
                         s->n_pending_turns ? "conversation" : "document", n, (long long)run_n_ctx(s->r));
    }
    if (run_check_budget(s->r, (int64_t)n, s->err, sizeof s->err)) {
        free(ids);
        return SESS_EFAIL;
    }
    char e[64];
    run_rewind(s->r, 0, 0, e, sizeof e);
    run_reset_sampler(s->r);
    int rc = evaluate_prompt(s, 0, ids, n, prompt_question_tokens(run_model(s->r), s->chat, question), n_eval, secs);
    free(ids);
    if (rc) return rc;
    if (!s->doc_tokens) s->doc_tokens = (int64_t)n;
    sess_clear_pending(s);
    return SESS_OK;
}

int sess_ask(session *s, const char *question)
{
    if (!question || !*question) return sess_fail(s, SESS_EFAIL, "the question is empty");
    if (tok_utf8_invalid_at(question, strlen(question)) >= 0)
        return sess_fail(s, SESS_EFAIL, "the question is not valid UTF-8");
    int64_t n = 0;
    double secs = 0;
    int rc = s->pending_doc ? prepare_pending(s, question, &n, &secs) : sess_prepare_turn(s, question, &n, &secs);
    if (rc) return rc;
    return answer(s, question, 0, n, secs);
}

/* ---- regenerate, branch */

int sess_regenerate(session *s)
{
    if (s->turns == 0 || !s->last_q || s->ans_start < 1)
        return sess_fail(s, SESS_ENOTFOUND, "nothing to regenerate yet");
    /* back to the question's end, whose last token is evaluated again for its logits */
    int rc = run_rewind(s->r, s->ans_start, s->seq_ans, s->err, sizeof s->err);
    if (!rc) rc = run_redo_last(s->r, s->err, sizeof s->err);
    if (rc) return rc;
    s->turns--;
    char *q = strdup(s->last_q);
    if (!q) return sess_fail(s, SESS_EFAIL, "out of memory");
    rc = answer(s, q, 1, 1, 0);
    free(q);
    return rc;
}

/* Question k (asked before this object's records) asked as text: the document and the conversation
 * before it come from the store and are prefilled again. */
static int branch_from_store(session *s, int k, const char *text)
{
    char e[1024];
    if (!s->have_db || !s->sid)
        return sess_fail(s, SESS_ENOTFOUND,
                         "this conversation is not saved: only questions asked in this window can be edited");
    if (!s->leaf) return sess_fail(s, SESS_ENOTFOUND, "nothing saved yet");
    sess_message *path = NULL;
    int n_path = 0;
    if (s->db.path(s->db.ud, s->leaf, &path, &n_path, e, sizeof e)) return sess_fail(s, SESS_EFAIL, "%s", e);
    int qi = 2 * (k - 1);
    if (qi >= n_path || strcmp(path[qi].role, "user") != 0) {
        sess_messages_free(path, n_path);
        return sess_fail(s, SESS_ENOTFOUND, "question %d is not in the saved conversation", k);
    }
    size_t dl, n = 0;
    int32_t *ids = NULL;
    int rc;
    char *doc = sess_reload_document(s, s->doc_path, s->doc_sha, &dl, &rc);
    const char **texts = doc ? malloc(sizeof *texts * (size_t)(qi + 1)) : NULL;
    if (!doc || !texts) {
        free(doc);
        sess_messages_free(path, n_path);
        return doc ? sess_fail(s, SESS_EFAIL, "out of memory") : rc;
    }
    for (int i = 0; i < qi; i++) texts[i] = path[i].text;
    rc = prompt_conversation(run_model(s->r), s->chat, doc, texts, qi, text, &ids, &n, s->err, sizeof s->err)
             ? SESS_EFAIL
             : SESS_OK;
    free(texts);
    free(doc);
    int64_t parent = path[qi].parent;
    sess_messages_free(path, n_path);
    if (rc) return rc;
    sess_note(s, "question %d edited: a new branch (the old one stays in the session); prefilling the document and "
              "the %d turns before it (%zu tokens)", k, k - 1, n);
    run_rewind(s->r, 0, 0, e, sizeof e);
    run_reset_sampler(s->r);
    run_set_question(s->r, prompt_question_tokens(run_model(s->r), s->chat, text));
    double t0 = run_clock_s();
    rc = run_feed(s->r, ids, (int64_t)n, NULL, NULL, s->err, sizeof s->err);
    free(ids);
    if (rc) {
        if (rc == SESS_ECANCELLED) snprintf(s->err, sizeof s->err, "cancelled; /resume continues the session");
        sess_drop_document(s);
        return rc;
    }
    s->leaf = parent;
    s->turns = k - 1;
    s->turn_base = k - 1;
    s->n_turns_here = 0;
    s->pending_record = -1;
    return answer(s, text, 0, (int64_t)n, run_clock_s() - t0);
}

int sess_branch(session *s, int k, const char *question)
{
    if (!question || !*question) return sess_fail(s, SESS_EFAIL, "the question is empty");
    if (k < 1 || k > s->turns)
        return sess_fail(s, SESS_ENOTFOUND, "there is no question %d (this conversation has %lld)", k,
                         (long long)s->turns);
    int64_t r = k - 1 - s->turn_base;
    if (r < 0 || r >= s->n_turns_here) return branch_from_store(s, k, question);
    int rc = run_rewind(s->r, s->turn_pos[r], s->turn_seq[r], s->err, sizeof s->err);
    if (rc) return rc;
    run_load_sampler(s->r, s->turn_samp[r]);
    s->leaf = s->turn_parent[r];
    s->turns = s->turn_base + r;
    s->n_turns_here = (int)r;   /* later records belong to the old branch */
    sess_note(s, "question %d edited: a new branch (the old one stays in the session)", k);
    int64_t n = 0;
    double secs = 0;
    if ((rc = sess_prepare_turn(s, question, &n, &secs))) return rc;
    return answer(s, question, 0, n, secs);
}
