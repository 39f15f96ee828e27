/* test_session.c - the engine's conversation object on the tiny models, with a real sqlite store:
 * a resumed conversation continues exactly as the uninterrupted one, a branch at question N
 * answers as a fresh conversation with that question would, a regeneration is a sibling branch,
 * a policy switch that is cancelled or refused leaves the conversation exactly as it was, and a
 * document changed on disk is refused when the conversation must be prefilled again, and a turn's
 * question is saved before its answer begins, a stopped answer saved marked interrupted. */
#include <criterion/criterion.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/document.h"
#include "engine/prompt.h"
#include "engine/session.h"
#include "engine/snapshot.h"
#include "store/persist.h"
#include "store/store.h"
#include "tests/sess_fixture.h"

#define TD "../shared/testdata/"

typedef sess_fixture fixture;
#define fixture_open sess_fixture_open
#define fixture_close sess_fixture_close
#define ask_ok sess_fixture_ask
#define open_session_stop sess_fixture_session
static session *open_session(const char *spec, const store_persist *sp) { return sess_fixture_session(spec, sp, NULL, 8); }

/* The last answer's ids, copied. */
static int64_t answer_ids(const session *s, int32_t *out, int64_t cap)
{
    const sess_answer *a = sess_last_answer(s);
    int64_t n = a->n_ids < cap ? a->n_ids : cap;
    memcpy(out, a->ids, sizeof(int32_t) * (size_t)n);
    return n;
}

static void expect_same_answer(const int32_t *a, int64_t na, const session *s, const char *what)
{
    int32_t b[64];
    int64_t nb = answer_ids(s, b, 64);
    cr_expect_eq(na, nb, "%s: %lld tokens against %lld", what, (long long)na, (long long)nb);
    cr_expect(na == nb && !memcmp(a, b, sizeof(int32_t) * (size_t)na), "%s: the answers differ", what);
}

Test(session, resume_continues_exactly_as_the_uninterrupted_conversation)
{
    fixture x;
    fixture_open(&x);
    /* uninterrupted, unsaved */
    session *u = open_session("chess:preset=aggressive", NULL);
    cr_assert(sess_open_document(u, x.doc, NULL, NULL, 0) == SESS_OK, "%s", sess_error(u));
    ask_ok(u, "What is it about?");
    ask_ok(u, "And then?");
    int32_t want[64];
    int64_t n_want = answer_ids(u, want, 64);
    int64_t n_tok_u;
    run_tokens(sess_run(u), &n_tok_u);
    /* the same first turn, saved; a new object resumes it from the snapshot and asks the second */
    session *a = open_session("chess:preset=aggressive", &x.sp);
    cr_assert(sess_open_document(a, x.doc, NULL, NULL, 0) == SESS_OK, "%s", sess_error(a));
    ask_ok(a, "What is it about?");
    int64_t sid = sess_stored_id(a);
    cr_assert(sid > 0);
    sess_free(a);
    session *b = open_session("chess:preset=aggressive", &x.sp);
    char key[32];
    snprintf(key, sizeof key, "%lld", (long long)sid);
    sess_resume_opts ro = { 0, 0, SESS_FORMAT_AUTO, NULL };
    cr_assert(sess_resume(b, key, &ro) == SESS_OK, "%s", sess_error(b));
    ask_ok(b, "And then?");
    cr_expect(sess_last_answer(b)->resumed, "the cache came from the snapshot");
    expect_same_answer(want, n_want, b, "resumed");
    int64_t n_tok_b;
    run_tokens(sess_run(b), &n_tok_b);
    cr_expect_eq(n_tok_b, n_tok_u, "the sequences have the same length");
    sess_free(b);
    sess_free(u);
    fixture_close(&x);
}

Test(session, resume_without_a_snapshot_prefills_the_conversation_again_with_the_question)
{
    fixture x;
    fixture_open(&x);
    /* `ask` style (deferred): the first turn is saved under the full cache's key; resumed under snapkv
     * there is no snapshot, so the document and the conversation are prefilled together with the
     * next question */
    session *a = open_session("full", &x.sp);
    cr_assert(sess_open_document(a, x.doc, "q", "talk", 1) == SESS_OK, "%s", sess_error(a));
    ask_ok(a, "What is it about?");
    char a1[1024];
    snprintf(a1, sizeof a1, "%s", sess_last_answer(a)->text);
    sess_free(a);
    session *b = open_session("snapkv:budget=0.5", &x.sp);
    sess_resume_opts ro = { 1, 0, SESS_FORMAT_AUTO, NULL };
    int rr = sess_resume(b, "talk", &ro);
    cr_assert(rr == SESS_OK, "%d %s", rr, sess_error(b));
    ask_ok(b, "And then?");
    cr_expect(!sess_last_answer(b)->resumed, "no snapshot under snapkv after the first answer");
    cr_expect(sess_turns(b) == 2);
    int32_t got[64];
    int64_t n_got = answer_ids(b, got, 64);
    /* the same prompt fed directly under snapkv */
    session *f = open_session("snapkv:budget=0.5", NULL);
    size_t dl, n = 0;
    char err[600];
    char *doc = doc_load(x.doc, DOC_MAX_BYTES, &dl, err, sizeof err);
    const char *turns[2] = { "What is it about?", a1 };
    int32_t *ids = NULL;
    cr_assert(doc && prompt_conversation(run_model(sess_run(f)), sess_format(b), doc, turns, 2, "And then?", &ids, &n, err,
                                         sizeof err) == 0, "%s", err);
    run_set_question((run *)sess_run(f), prompt_question_tokens(run_model(sess_run(f)), sess_format(b), "And then?"));
    cr_assert(sess_feed(f, ids, (int64_t)n, NULL, NULL) == SESS_OK, "%s", sess_error(f));
    gen_result g;
    cr_assert(sess_generate(f, 8, &g) == SESS_OK, "%s", sess_error(f));
    expect_same_answer(got, n_got, f, "prefilled again");
    free(ids);
    free(doc);
    sess_free(f);
    sess_free(b);
    fixture_close(&x);
}

Test(session, a_branch_at_question_n_answers_as_a_fresh_conversation_would)
{
    fixture x;
    fixture_open(&x);
    session *s = open_session("full", &x.sp);
    cr_assert(sess_open_document(s, x.doc, NULL, NULL, 0) == SESS_OK, "%s", sess_error(s));
    ask_ok(s, "What is it about?");
    ask_ok(s, "And then?");
    ask_ok(s, "Anything else?");
    cr_assert(sess_branch(s, 2, "Who wrote it?") == SESS_OK, "%s", sess_error(s));
    cr_expect_eq(sess_turns(s), 2, "the branch replaced question 2 and what came after it");
    int32_t got[64];
    int64_t n_got = answer_ids(s, got, 64);
    /* the fresh conversation */
    session *f = open_session("full", NULL);
    cr_assert(sess_open_document(f, x.doc, NULL, NULL, 0) == SESS_OK);
    ask_ok(f, "What is it about?");
    ask_ok(f, "Who wrote it?");
    expect_same_answer(got, n_got, f, "branch");
    /* both branches are in the store: question 2 has two versions with the same parent */
    store_message *m = NULL;
    int n = 0;
    cr_assert(store_session_messages(x.db, sess_stored_id(s), &m, &n) == 0);
    cr_expect_eq(n, 8, "3 turns, then the branched turn: 8 messages, got %d", n);
    int64_t parent_a = -1, parent_b = -1;
    for (int i = 0; i < n; i++) {
        if (!strcmp(m[i].text, "And then?")) parent_a = m[i].parent;
        if (!strcmp(m[i].text, "Who wrote it?")) parent_b = m[i].parent;
    }
    cr_expect(parent_a > 0 && parent_a == parent_b, "the edited question branches from the same answer");
    store_messages_free(m, n);
    sess_free(f);
    sess_free(s);
    fixture_close(&x);
}

Test(session, a_branch_before_this_object_rebuilds_from_the_store)
{
    fixture x;
    fixture_open(&x);
    session *a = open_session("full", &x.sp);
    cr_assert(sess_open_document(a, x.doc, NULL, NULL, 0) == SESS_OK);
    ask_ok(a, "What is it about?");
    char a1[1024];
    snprintf(a1, sizeof a1, "%s", sess_last_answer(a)->text);
    ask_ok(a, "And then?");
    int64_t sid = sess_stored_id(a);
    sess_free(a);
    session *b = open_session("full", &x.sp);
    char key[32];
    snprintf(key, sizeof key, "%lld", (long long)sid);
    cr_assert(sess_resume(b, key, NULL) == SESS_OK, "%s", sess_error(b));
    cr_assert(sess_branch(b, 2, "Who wrote it?") == SESS_OK, "%s", sess_error(b));
    cr_expect_eq(sess_turns(b), 2);
    int32_t got[64];
    int64_t n_got = answer_ids(b, got, 64);
    /* what the store's replay must be: the document, turn 1 and the new question in one prompt */
    session *f = open_session("full", NULL);
    size_t dl, n = 0;
    char err[600];
    char *doc = doc_load(x.doc, DOC_MAX_BYTES, &dl, err, sizeof err);
    cr_assert(doc, "%s", err);
    const char *turns[2] = { "What is it about?", a1 };
    int32_t *ids = NULL;
    cr_assert(prompt_conversation(run_model(sess_run(f)), sess_format(b), doc, turns, 2, "Who wrote it?", &ids, &n, err,
                                  sizeof err) == 0, "%s", err);
    cr_assert(sess_feed(f, ids, (int64_t)n, NULL, NULL) == SESS_OK, "%s", sess_error(f));
    gen_result g;
    cr_assert(sess_generate(f, 8, &g) == SESS_OK, "%s", sess_error(f));
    expect_same_answer(got, n_got, f, "rebuilt branch");
    free(ids);
    free(doc);
    sess_free(f);
    sess_free(b);
    fixture_close(&x);
}

Test(session, regenerate_is_a_sibling_of_the_first_answer)
{
    fixture x;
    fixture_open(&x);
    session *s = open_session("chess:preset=aggressive", &x.sp);
    cr_assert(sess_open_document(s, x.doc, NULL, NULL, 0) == SESS_OK);
    ask_ok(s, "What is it about?");
    int32_t first[64];
    int64_t n_first = answer_ids(s, first, 64);
    int64_t user = sess_last_answer(s)->user_msg;
    cr_assert(sess_regenerate(s) == SESS_OK, "%s", sess_error(s));
    /* greedy: the rewind is exact, so the same answer comes again, saved beside the first */
    expect_same_answer(first, n_first, s, "regenerated");
    cr_expect_eq(sess_last_answer(s)->user_msg, user, "the regeneration answers the same question message");
    cr_expect_eq(sess_turns(s), 1);
    store_message *m = NULL;
    int n = 0;
    cr_assert(store_session_messages(x.db, sess_stored_id(s), &m, &n) == 0);
    int answers = 0;
    for (int i = 0; i < n; i++) answers += !strcmp(m[i].role, "assistant") && m[i].parent == user;
    cr_expect_eq(answers, 2, "two answers to one question");
    store_messages_free(m, n);
    sess_free(s);
    fixture_close(&x);
}

/* Issue 27: the question is in the store before the first answer token (a process killed mid-answer
 * keeps it), and an answer stopped part way by the abort flag is saved as it stands, marked
 * "interrupted" in its metrics, after that question; the conversation resumes from it. */
typedef struct first_piece {
    store *db;
    session *s;
    volatile sig_atomic_t stop;
    int pieces;
    int64_t sid;                 /* the stored conversation when the first piece came (0: none) */
    int questions;               /* its user messages then */
} first_piece;

static void stop_at_first_piece(void *ud, const char *p, size_t n)
{
    first_piece *f = ud;
    (void)p;
    if (!n || f->pieces++) return;
    f->sid = sess_stored_id(f->s);
    store_message *m = NULL;
    int k = 0;
    if (f->sid && store_session_messages(f->db, f->sid, &m, &k) == 0)
        for (int i = 0; i < k; i++)
            f->questions += !strcmp(m[i].role, "user") && !strcmp(m[i].text, "What is it about?");
    store_messages_free(m, k);
    f->stop = 1;
}

Test(session, the_question_is_saved_before_the_answer_and_a_stopped_answer_is_marked_interrupted)
{
    fixture x;
    fixture_open(&x);
    session *s = open_session_stop("full", &x.sp, NULL, 4000);
    first_piece f = { x.db, s, 0, 0, 0, 0 };
    sess_callbacks cb = { &f, NULL, stop_at_first_piece, NULL, NULL, NULL, NULL, NULL };
    sess_set_callbacks(s, &cb, &f.stop);
    cr_assert(sess_open_document(s, x.doc, NULL, NULL, 0) == SESS_OK);
    ask_ok(s, "What is it about?");
    cr_expect(f.sid > 0 && f.questions == 1, "the question was not in the store as the answer began (session %lld, "
              "%d questions)", (long long)f.sid, f.questions);
    const sess_answer *a = sess_last_answer(s);
    cr_expect_eq(a->gen.stop, GEN_STOP_INTERRUPT);
    cr_expect(a->gen.n_gen > 0 && a->gen.n_gen < 4000, "a partial answer: %lld tokens", (long long)a->gen.n_gen);
    store_message *m = NULL;
    int n = 0;
    cr_assert(store_session_messages(x.db, sess_stored_id(s), &m, &n) == 0);
    cr_assert_eq(n, 2, "the question once and the partial answer");
    cr_expect(!strcmp(m[0].role, "user") && m[0].id == a->user_msg);
    cr_expect(!strcmp(m[1].role, "assistant") && m[1].parent == m[0].id && m[1].text[0], "the answer as it stands");
    cr_expect(strstr(m[1].metrics, "\"interrupted\": true"), "metrics: %s", m[1].metrics);
    store_messages_free(m, n);
    /* the next answer, not stopped, says so too; a resumed object continues after both */
    f.pieces = 1;
    f.stop = 0;
    samp_params sp = samp_params_default();
    sp.temperature = 0;
    sess_set_sampling(s, &sp, 8);
    ask_ok(s, "And then?");
    cr_assert(store_session_messages(x.db, sess_stored_id(s), &m, &n) == 0);
    cr_expect(n == 4 && strstr(m[3].metrics, "\"interrupted\": false"), "%d messages; metrics: %s", n,
              n == 4 ? m[3].metrics : "");
    store_messages_free(m, n);
    session *r = open_session("full", &x.sp);
    cr_assert(sess_resume(r, "", NULL) == SESS_OK, "%s", sess_error(r));
    cr_expect_eq(sess_turns(r), 2);
    sess_free(r);
    sess_free(s);
    fixture_close(&x);
}

/* Cancel the running prefill once it has begun. */
static volatile sig_atomic_t stop_flag;
static void cancel_on_progress(void *ud, int64_t done, int64_t total)
{
    (void)ud;
    (void)total;
    if (done > 0) stop_flag = 1;
}

static void expect_state(session *s, const char *policy, int64_t pos, const int32_t *toks, int64_t n_toks,
                         const char *what)
{
    int64_t n;
    const int32_t *t = run_tokens(sess_run(s), &n);
    cr_expect_str_eq(pol_set_spec(run_policies(sess_run(s)))->text, policy, "%s: the policy changed", what);
    cr_expect_eq(run_pos(sess_run(s)), pos, "%s: the cache moved", what);
    cr_expect(n == n_toks && !memcmp(t, toks, sizeof(int32_t) * (size_t)n), "%s: the sequence changed", what);
}

Test(session, a_cancelled_or_refused_policy_switch_leaves_the_conversation_as_it_was)
{
    fixture x;
    fixture_open(&x);
    session *s = open_session("full", &x.sp);
    session *c = open_session("full", NULL);   /* the control never switches */
    cr_assert(sess_open_document(s, x.doc, NULL, NULL, 0) == SESS_OK);
    cr_assert(sess_open_document(c, x.doc, NULL, NULL, 0) == SESS_OK);
    ask_ok(s, "What is it about?");
    ask_ok(c, "What is it about?");
    int64_t n0;
    const int32_t *t0 = run_tokens(sess_run(s), &n0);
    int32_t *keep = malloc(sizeof(int32_t) * (size_t)n0);
    memcpy(keep, t0, sizeof(int32_t) * (size_t)n0);
    int64_t pos0 = run_pos(sess_run(s));
    /* cancelled part way through the new prefill */
    sess_callbacks cb = { NULL, cancel_on_progress, NULL, NULL, NULL, NULL, NULL, NULL };
    stop_flag = 0;
    sess_set_callbacks(s, &cb, &stop_flag);
    cr_expect_eq(sess_set_policy(s, "snapkv:budget=0.5", NULL), SESS_ECANCELLED, "%s", sess_error(s));
    sess_set_callbacks(s, NULL, NULL);
    expect_state(s, "full", pos0, keep, n0, "cancelled");
    /* refused: a budget larger than the context */
    cr_expect_eq(sess_set_policy(s, "snapkv:budget=100000", NULL), SESS_EFAIL);
    cr_expect(strstr(sess_error(s), "budget"), "the refusal names the budget: %s", sess_error(s));
    expect_state(s, "full", pos0, keep, n0, "refused");
    /* and the conversation goes on exactly as the control's */
    ask_ok(s, "And then?");
    ask_ok(c, "And then?");
    int32_t want[64];
    int64_t n_want = answer_ids(c, want, 64);
    expect_same_answer(want, n_want, s, "after the failed switches");
    free(keep);
    sess_free(c);
    sess_free(s);
    fixture_close(&x);
}

Test(session, a_changed_document_is_refused_when_the_conversation_is_prefilled_again)
{
    fixture x;
    fixture_open(&x);
    session *a = open_session("full", &x.sp);
    cr_assert(sess_open_document(a, x.doc, NULL, "changing", 0) == SESS_OK);
    ask_ok(a, "What is it about?");
    sess_free(a);
    FILE *f = fopen(x.doc, "ab");
    cr_assert(f);
    fputs("\nA sentence added later.\n", f);
    fclose(f);
    /* under snapkv there is no snapshot: the document must be read again, and it changed */
    session *b = open_session("snapkv:budget=0.5", &x.sp);
    sess_resume_opts ro = { 0, 0, SESS_FORMAT_AUTO, NULL };
    cr_expect_eq(sess_resume(b, "changing", &ro), SESS_EMISMATCH, "%s", sess_error(b));
    cr_expect(strstr(sess_error(b), x.doc) && strstr(sess_error(b), "has changed"), "%s", sess_error(b));
    cr_expect(!sess_have_document(b), "nothing is loaded");
    sess_free(b);
    /* the snapshot under the full cache needs no document: that resume works */
    session *c = open_session("full", &x.sp);
    cr_expect_eq(sess_resume(c, "changing", &ro), SESS_OK, "%s", sess_error(c));
    sess_free(c);
    fixture_close(&x);
}

Test(session, bad_input_is_one_clear_error)
{
    fixture x;
    fixture_open(&x);
    session *s = open_session("full", &x.sp);
    cr_expect_eq(sess_ask(s, ""), SESS_EFAIL);
    cr_expect_str_eq(sess_error(s), "the question is empty");
    cr_expect_eq(sess_open_document(s, "/nonexistent/doc.txt", NULL, NULL, 0), SESS_EFAIL);
    cr_expect(strstr(sess_error(s), "/nonexistent/doc.txt"), "%s", sess_error(s));
    cr_expect_eq(sess_resume(s, "no such session", NULL), SESS_ENOTFOUND);
    cr_expect_eq(sess_regenerate(s), SESS_ENOTFOUND);
    cr_expect_eq(sess_set_policy(s, "nosuchpolicy", NULL), SESS_EFAIL);
    cr_expect(strstr(sess_error(s), "nosuchpolicy"), "%s", sess_error(s));
    sess_free(s);
    fixture_close(&x);
}

/* A decision trace over a text of the prompt: the answer is the same as without it, the trace follows
 * the text's tokens, and a text that is not in the prompt fails the question with one clear line. */
Test(session, a_trace_follows_a_text_of_the_prompt_and_changes_nothing)
{
    fixture x;
    fixture_open(&x);
    int32_t plain[64];
    int64_t n_plain;
    {
        session *s = open_session("sentkv:budget=200", NULL);
        cr_assert(sess_open_document(s, x.doc, NULL, NULL, 1) == SESS_OK, "%s", sess_error(s));
        ask_ok(s, "What happened at the mill?");
        n_plain = answer_ids(s, plain, 64);
        int64_t lo, hi;
        cr_expect_str_eq(sess_trace_text(s, &lo, &hi), "", "no trace unless asked");
        sess_free(s);
    }
    session *s = open_session("sentkv:budget=200", NULL);
    cr_assert(sess_open_document(s, x.doc, NULL, NULL, 1) == SESS_OK, "%s", sess_error(s));
    cr_assert(sess_trace(s, "the mill") == SESS_OK);
    ask_ok(s, "What happened at the mill?");
    expect_same_answer(plain, n_plain, s, "with a trace");
    int64_t lo, hi;
    const char *tr = sess_trace_text(s, &lo, &hi);
    cr_expect(lo > 0 && hi > lo && hi - lo <= 4, "the trace follows positions %lld..%lld", (long long)lo, (long long)hi);
    cr_expect(strstr(tr, "] sentkv segments L") != NULL, "%s", tr);
    sess_free(s);
    s = open_session("sentkv:budget=200", NULL);
    cr_assert(sess_open_document(s, x.doc, NULL, NULL, 1) == SESS_OK, "%s", sess_error(s));
    cr_assert(sess_trace(s, "words not in it") == SESS_OK);
    cr_expect_eq(sess_ask(s, "What happened at the mill?"), SESS_EFAIL);
    cr_expect_str_eq(sess_error(s), "the traced text 'words not in it' is not in the prompt");
    sess_free(s);
    fixture_close(&x);
}

static char last_note[4096];   /* the notes since it was last cleared, one a line */
static void keep_note(void *ud, const char *msg)
{
    (void)ud;
    size_t l = strlen(last_note);
    snprintf(last_note + l, sizeof last_note - l, "%s%s", l ? "\n" : "", msg);
}

Test(session, a_conversation_deleted_meanwhile_goes_on_as_a_new_one)
{
    fixture x;
    fixture_open(&x);
    session *s = open_session("full", &x.sp);
    sess_callbacks cb = { NULL, NULL, NULL, NULL, NULL, keep_note, NULL, NULL };
    sess_set_callbacks(s, &cb, NULL);
    cr_assert(sess_open_document(s, x.doc, NULL, NULL, 0) == SESS_OK);
    ask_ok(s, "What is it about?");
    int64_t first = sess_stored_id(s);
    /* another process deletes it */
    char err[600];
    store *other = store_open(x.db_path, err, sizeof err);
    cr_assert(other, "%s", err);
    cr_assert(store_session_delete(other, first) == 0);
    store_close(other);
    last_note[0] = 0;
    ask_ok(s, "And then?");
    cr_expect_gt(sess_stored_id(s), 0, "a new stored conversation (sqlite may give it the freed id)");
    cr_expect(strstr(last_note, "was deleted meanwhile"), "said: %s", last_note);
    /* the new one holds this turn and a snapshot that resumes the whole conversation */
    store_message *m = NULL;
    int n = 0;
    cr_assert(store_session_messages(x.db, sess_stored_id(s), &m, &n) == 0);
    cr_expect_eq(n, 2, "this turn's two messages");
    store_messages_free(m, n);
    int64_t n_tok;
    run_tokens(sess_run(s), &n_tok);
    session *r = open_session("full", &x.sp);
    char key[32];
    snprintf(key, sizeof key, "#%lld", (long long)sess_stored_id(s));
    cr_assert(sess_resume(r, key, NULL) == SESS_OK, "%s", sess_error(r));
    int64_t n_r;
    run_tokens(sess_run(r), &n_r);
    cr_expect_eq(n_r, n_tok, "the snapshot holds the whole conversation");
    sess_free(r);
    sess_free(s);
    fixture_close(&x);
}

/* Flip a byte in the middle of the snapshot saved after message msg (in its own part, not in a page
 * it shares with other snapshots). */
static void corrupt_snapshot(const char *db_path, int64_t msg)
{
    sqlite3 *db;
    cr_assert(sqlite3_open(db_path, &db) == SQLITE_OK);
    sqlite3_stmt *st;
    cr_assert(sqlite3_prepare_v2(db, "SELECT id, IFNULL(stored, bytes) FROM snapshots WHERE message_id = ?", -1, &st, NULL) == SQLITE_OK);
    sqlite3_bind_int64(st, 1, msg);
    cr_assert(sqlite3_step(st) == SQLITE_ROW, "no snapshot after message %lld", (long long)msg);
    int64_t id = sqlite3_column_int64(st, 0), bytes = sqlite3_column_int64(st, 1);
    sqlite3_finalize(st);
    sqlite3_blob *b;
    cr_assert(sqlite3_blob_open(db, "main", "snapshots", "data", id, 1, &b) == SQLITE_OK);
    unsigned char c;
    cr_assert(sqlite3_blob_read(b, &c, 1, (int)(bytes / 2)) == SQLITE_OK);
    c ^= 0x5a;
    cr_assert(sqlite3_blob_write(b, &c, 1, (int)(bytes / 2)) == SQLITE_OK);
    sqlite3_blob_close(b);
    sqlite3_close(db);
}

Test(session, a_corrupt_newest_snapshot_falls_back_to_an_older_one)
{
    fixture x;
    fixture_open(&x);
    session *a = open_session("full", &x.sp);
    cr_assert(sess_open_document(a, x.doc, NULL, "fallback", 0) == SESS_OK);
    ask_ok(a, "What is it about?");
    ask_ok(a, "And then?");
    int64_t last = sess_last_answer(a)->answer_msg;
    sess_free(a);
    corrupt_snapshot(x.db_path, last);
    session *b = open_session("full", &x.sp);
    sess_callbacks cb = { NULL, NULL, NULL, NULL, NULL, keep_note, NULL, NULL };
    sess_set_callbacks(b, &cb, NULL);
    last_note[0] = 0;
    cr_assert(sess_resume(b, "fallback", NULL) == SESS_OK, "%s", sess_error(b));
    cr_expect(strstr(last_note, "unusable") && strstr(last_note, "restored the one after answer 1"), "said: %s",
              last_note);
    cr_expect_eq(sess_turns(b), 2);
    ask_ok(b, "Anything else?");   /* and the conversation goes on */
    sess_free(b);
    fixture_close(&x);
}

/* Damage the store under a conversation's snapshots as a failing disk or a hand edit could (foreign
 * keys off, as in the sqlite shell). */
static void damage_store(const char *db_path, const char *sql)
{
    sqlite3 *db;
    cr_assert(sqlite3_open(db_path, &db) == SQLITE_OK);
    char *e = NULL;
    cr_assert(sqlite3_exec(db, sql, NULL, NULL, &e) == SQLITE_OK, "%s: %s", sql, e);
    cr_assert(sqlite3_changes(db) > 0, "%s changed nothing", sql);
    sqlite3_close(db);
}

/* A store that cannot put a snapshot back together (a page deleted or written over, a row whose
 * size or data changed) is a snapshot that cannot be used: the conversation is prefilled again and
 * says so, and the snapshot saved then repairs the store, so the next resume restores again. */
Test(session, a_damaged_store_under_the_snapshots_falls_back_to_prefill_and_is_repaired, .timeout = 240)
{
#define SHARED "(SELECT hash FROM snapshot_chunks GROUP BY hash HAVING COUNT(DISTINCT snapshot_id) = 3 ORDER BY hash LIMIT 1)"
    static const char *const damage[] = {
        "DELETE FROM chunks WHERE hash = " SHARED,                          /* a page all three share, gone */
        "UPDATE chunks SET data = zeroblob(length(data)) WHERE hash = " SHARED, /* ... written over */
        "UPDATE snapshots SET bytes = bytes + 4356",                        /* rows that disagree with their data */
        "UPDATE snapshots SET data = zeroblob(length(data))",
    };
#undef SHARED
    for (int k = 0; k < (int)(sizeof damage / sizeof damage[0]); k++) {
        fixture x;
        fixture_open(&x);
        session *a = open_session("full", &x.sp);
        cr_assert(sess_open_document(a, x.doc, NULL, "damaged", 0) == SESS_OK);
        ask_ok(a, "What is it about?");
        ask_ok(a, "And then?");
        ask_ok(a, "Why?");
        int64_t n_a;
        run_tokens(sess_run(a), &n_a);
        sess_free(a);
        damage_store(x.db_path, damage[k]);
        sess_callbacks cb = { NULL, NULL, NULL, NULL, NULL, keep_note, NULL, NULL };
        session *b = open_session("full", &x.sp);
        sess_set_callbacks(b, &cb, NULL);
        last_note[0] = 0;
        cr_assert(sess_resume(b, "damaged", NULL) == SESS_OK, "damage %d: %s", k, sess_error(b));
        cr_expect(strstr(last_note, "unusable"), "damage %d: said: %s", k, last_note);
        cr_expect_eq(sess_turns(b), 3, "damage %d", k);
        int64_t n_b;
        run_tokens(sess_run(b), &n_b);
        cr_expect_eq(n_b, n_a, "damage %d: the whole conversation is back", k);
        sess_free(b);
        session *c = open_session("full", &x.sp);
        sess_set_callbacks(c, &cb, NULL);
        last_note[0] = 0;
        cr_assert(sess_resume(c, "damaged", NULL) == SESS_OK, "damage %d: %s", k, sess_error(c));
        cr_expect(strstr(last_note, "restored") && !strstr(last_note, "unusable"),
                  "damage %d: the store was not repaired by the snapshot saved after the prefill: %s", k, last_note);
        ask_ok(c, "Anything else?");
        sess_free(c);
        fixture_close(&x);
    }
}

static int disk_full(void *ud, int64_t sid, int64_t message, const char *key, int64_t n_tokens, const void *data,
                     size_t len, char *err, size_t errlen)
{
    snprintf(err, errlen, "saving the snapshot: database or disk is full");
    return -1;
}

/* A turn saved without its snapshot says so once, with the store's reason whole. */
Test(session, a_snapshot_that_cannot_be_saved_is_said_once_with_its_reason)
{
    fixture x;
    fixture_open(&x);
    sess_persist full = x.sp.ops;
    full.put_snapshot = disk_full;
    session *s = open_session("full", NULL);
    cr_assert(sess_attach_store(s, &full) == 0, "%s", sess_error(s));
    cr_assert(sess_open_document(s, x.doc, NULL, NULL, 0) == SESS_OK);
    cr_assert_eq(sess_ask(s, "What is it about?"), SESS_ESAVE, "%s", sess_error(s));
    char want[256];
    snprintf(want, sizeof want,
             "the turn is saved in session %lld, its snapshot is not (saving the snapshot: database or disk is full)",
             (long long)sess_stored_id(s));
    cr_expect_str_eq(sess_error(s), want);
    store_message *m = NULL;
    int n = 0;
    cr_assert(store_session_messages(x.db, sess_stored_id(s), &m, &n) == 0);
    cr_expect_eq(n, 2, "the question and the answer are saved");
    store_messages_free(m, n);
    sess_free(s);
    fixture_close(&x);
}

/* Consecutive snapshots of one conversation share their unchanged pages: three turns take far less
 * than three whole snapshots, each reads back whole, and deleting the session frees its pages. */
Test(session, snapshots_share_the_pages_that_did_not_change)
{
    fixture x;
    fixture_open(&x);
    session *s = open_session("full", &x.sp);
    cr_assert(sess_open_document(s, x.doc, NULL, "shared", 0) == SESS_OK);
    const char *qs[3] = { "What is it about?", "And then?", "Anything else?" };
    int64_t logical = 0;
    for (int i = 0; i < 3; i++) {
        ask_ok(s, qs[i]);
        logical += (int64_t)sess_last_answer(s)->snapshot_bytes;
    }
    store_session ss;
    cr_assert(store_session_find(x.db, "shared", &ss) == 0);
    cr_expect_eq(ss.n_snapshots, 3);
    int64_t one = (int64_t)sess_last_answer(s)->snapshot_bytes;
    cr_expect_lt(ss.snapshot_bytes, one * 3 / 2, "three snapshots take %lld bytes, one whole snapshot %lld",
                 (long long)ss.snapshot_bytes, (long long)one);
    cr_expect_gt(ss.snapshot_bytes, one / 2, "the pages are stored (%lld bytes)", (long long)ss.snapshot_bytes);
    cr_log_info("3 snapshots: %lld bytes logical, %lld stored, one snapshot %lld", (long long)logical,
                (long long)ss.snapshot_bytes, (long long)one);
    /* every one of them reads back whole: its checksum (verified by the restore) covers the pages */
    store_message *m = NULL;
    int n = 0;
    cr_assert(store_session_messages(x.db, ss.id, &m, &n) == 0);
    int restored = 0;
    for (int i = 0; i < n; i++) {
        if (strcmp(m[i].role, "assistant")) continue;
        void *data;
        size_t len;
        cr_assert(store_snapshot_get(x.db, m[i].id, "full", &data, &len) == 0, "%s", store_error(x.db));
        char err[512];
        cr_expect(run_check_snapshot(sess_run(s), data, len, sess_model_sha(s), err, sizeof err) == 0,
                  "message %lld: %s", (long long)m[i].id, err);
        free(data);
        restored++;
    }
    cr_expect_eq(restored, 3);
    store_messages_free(m, n);
    cr_assert(store_session_delete(x.db, ss.id) == 0);
    sqlite3 *db;
    cr_assert(sqlite3_open(x.db_path, &db) == SQLITE_OK);
    sqlite3_stmt *st;
    cr_assert(sqlite3_prepare_v2(db, "SELECT COUNT(*) FROM chunks", -1, &st, NULL) == SQLITE_OK);
    cr_assert(sqlite3_step(st) == SQLITE_ROW);
    cr_expect_eq(sqlite3_column_int(st, 0), 0, "a deleted session's pages are freed");
    sqlite3_finalize(st);
    sqlite3_close(db);
    sess_free(s);
    fixture_close(&x);
}

/* What the text callback streamed. */
static char streamed[4096];
static void collect_text(void *ud, const char *p, size_t n)
{
    (void)ud;
    size_t l = strlen(streamed);
    if (l + n < sizeof streamed) {
        memcpy(streamed + l, p, n);
        streamed[l + n] = 0;
    }
}

Test(session, a_stop_sequence_ends_the_answer_before_it_and_is_never_streamed)
{
    fixture x;
    fixture_open(&x);
    /* the answer without a stop, then a stop sequence taken from its middle */
    session *u = open_session_stop("full", NULL, NULL, 24);
    cr_assert(sess_open_document(u, x.doc, NULL, NULL, 0) == SESS_OK);
    ask_ok(u, "What is it about?");
    const sess_answer *ua = sess_last_answer(u);
    size_t L = strlen(ua->text);
    cr_assert(L > 20, "a long enough answer: '%s'", ua->text);
    char stop[16];
    size_t at = L / 2;
    snprintf(stop, sizeof stop, "%.6s", ua->text + at);
    const char *first = strstr(ua->text, stop);
    cr_assert(first);
    size_t cut = (size_t)(first - ua->text);
    int32_t uid[32];
    int64_t un = answer_ids(u, uid, 32);
    /* with it: the text ends where the stop begins (or earlier, at the token it begins in) */
    session *s = open_session_stop("full", NULL, stop, 24);
    sess_callbacks cb = { NULL, NULL, collect_text, NULL, NULL, NULL, NULL, NULL };
    sess_set_callbacks(s, &cb, NULL);
    cr_assert(sess_open_document(s, x.doc, NULL, NULL, 0) == SESS_OK);
    streamed[0] = 0;
    ask_ok(s, "What is it about?");
    const sess_answer *sa = sess_last_answer(s);
    cr_expect_eq(sa->gen.stop, GEN_STOP_SEQUENCE, "stopped by the sequence");
    cr_expect(strstr(sa->text, stop) == NULL, "the stop sequence is not in the answer: '%s'", sa->text);
    cr_expect(strstr(streamed, stop) == NULL, "the stop sequence was never streamed: '%s'", streamed);
    cr_expect_str_eq(streamed, sa->text, "what was streamed is the answer");
    cr_expect(strlen(sa->text) <= cut && !strncmp(sa->text, ua->text, strlen(sa->text)),
              "the answer is the first one's text before the stop: '%s' / '%s'", sa->text, ua->text);
    int32_t sid_[32];
    int64_t sn = answer_ids(s, sid_, 32);
    cr_expect(sn < un && !memcmp(sid_, uid, sizeof(int32_t) * (size_t)sn), "the kept tokens are a prefix");
    /* the cache holds the sequence but its last sampled token, as after any answer */
    int64_t n_seq;
    run_tokens(sess_run(s), &n_seq);
    cr_expect_eq(run_pos(sess_run(s)), sn > 0 ? n_seq - 1 : n_seq, "the cache went back to the kept tokens");
    /* and the conversation goes on from there */
    ask_ok(s, "And then?");
    sess_free(s);
    sess_free(u);
    fixture_close(&x);
}

Test(session, a_cancelled_document_open_goes_back_to_the_conversation_before_it)
{
    fixture x;
    fixture_open(&x);
    session *s = open_session("full", &x.sp);
    session *c = open_session("full", NULL);   /* the control opens nothing else */
    cr_assert(sess_open_document(s, x.doc, NULL, NULL, 0) == SESS_OK);
    cr_assert(sess_open_document(c, x.doc, NULL, NULL, 0) == SESS_OK);
    ask_ok(s, "What is it about?");
    ask_ok(c, "What is it about?");
    int64_t sid = sess_stored_id(s), n0;
    const int32_t *t0 = run_tokens(sess_run(s), &n0);
    int32_t *keep = malloc(sizeof(int32_t) * (size_t)n0);
    memcpy(keep, t0, sizeof(int32_t) * (size_t)n0);
    int64_t pos0 = run_pos(sess_run(s));
    sess_callbacks cb = { NULL, cancel_on_progress, NULL, NULL, NULL, NULL, NULL, NULL };
    stop_flag = 0;
    sess_set_callbacks(s, &cb, &stop_flag);
    /* another text (the same one would be restored from its snapshot, with nothing to cancel) */
    char other[160];
    snprintf(other, sizeof other, "%s/other.txt", x.dir);
    FILE *f = fopen(other, "wb");
    cr_assert(f);
    fprintf(f, "Another text begins here.\n");
    fclose(f);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "cat %s >> %s", x.doc, other);
    cr_assert(system(cmd) == 0);
    cr_expect_eq(sess_open_document(s, other, NULL, NULL, 0), SESS_ECANCELLED);
    cr_expect(strstr(sess_error(s), "back to doc.txt as it was"), "%s", sess_error(s));
    sess_set_callbacks(s, NULL, NULL);
    expect_state(s, "full", pos0, keep, n0, "cancelled open");
    cr_expect_str_eq(sess_document_title(s), "doc.txt");
    cr_expect_eq(sess_stored_id(s), sid, "the same stored conversation");
    ask_ok(s, "And then?");
    ask_ok(c, "And then?");
    int32_t want[64];
    int64_t n_want = answer_ids(c, want, 64);
    expect_same_answer(want, n_want, s, "after the cancelled open");
    free(keep);
    sess_free(c);
    sess_free(s);
    fixture_close(&x);
}

Test(session, policy_checks_are_the_same_before_and_after_a_document)
{
    fixture x;
    fixture_open(&x);
    session *s = open_session("full", NULL);
    /* before a document: against the whole context */
    cr_expect_eq(sess_check_policy(s, "quest:budget=0", NULL), SESS_EFAIL);
    cr_expect(strstr(sess_error(s), "below two pages"), "%s", sess_error(s));
    cr_expect_eq(sess_set_policy(s, "snapkv:budget=999999", NULL), SESS_EFAIL);
    cr_expect(strstr(sess_error(s), "larger than the context"), "%s", sess_error(s));
    cr_expect_str_eq(pol_set_spec(run_policies(sess_run(s)))->text, "full");
    /* with one: a decode-time switch is checked against it too, and nothing changes */
    cr_assert(sess_open_document(s, x.doc, NULL, NULL, 0) == SESS_OK);
    cr_expect_eq(sess_set_policy(s, "quest:budget=0", NULL), SESS_EFAIL);
    cr_expect_str_eq(pol_set_spec(run_policies(sess_run(s)))->text, "full");
    cr_expect_eq(sess_policy_pending(s), 0);
    /* a budget given apart replaces the spec's own */
    cr_expect_eq(sess_set_policy(s, "quest:budget=0.5", NULL), SESS_OK, "%s", sess_error(s));
    cr_expect_eq(sess_policy_pending(s), 1, "a decode-time policy waits for the next answer");
    cr_expect_eq(sess_set_policy(s, "quest:budget=0.5", "0.25"), SESS_OK, "%s", sess_error(s));
    cr_expect_str_eq(pol_set_spec(run_policies(sess_run(s)))->text, "quest:budget=0.25");
    cr_expect_eq(sess_check_policy(s, "take:budget=0.5", "0.001"), SESS_EFAIL);
    cr_expect(strstr(sess_error(s), "probe tokens"), "%s", sess_error(s));
    ask_ok(s, "What is it about?");
    cr_expect_eq(sess_policy_pending(s), 0, "the answer used it");
    sess_free(s);
    fixture_close(&x);
}
