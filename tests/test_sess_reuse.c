/* test_sess_reuse.c - a conversation never reads text twice where it already has it: a comparison
 * (finished or cancelled) leaves the cache where it was without evaluating anything again, a
 * document read once is restored from its snapshot when it is opened again (same content, any
 * path), and a switch back to a policy restores its older snapshot and reads only what came after.
 * On the tiny Gemma model (sliding window 32), whose sliding-window layers drop what a later query
 * no longer sees, with a real sqlite store. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/session.h"
#include "store/persist.h"
#include "store/store.h"
#include "tests/sess_fixture.h"


typedef struct fixture {
    sess_fixture f;
    char copy[128];   /* the same text as f.doc under another name */
} fixture;

static void fixture_open(fixture *x)
{
    sess_fixture_open(&x->f);
    snprintf(x->copy, sizeof x->copy, "%s/same-text.txt", x->f.dir);
    sess_fixture_copy(x->f.doc, x->copy);
}

static session *open_session(const char *spec, const store_persist *sp) { return sess_fixture_session(spec, sp, NULL, 8); }
#define ask_ok sess_fixture_ask

static void expect_same_answer(const session *want, const session *s, const char *what)
{
    const sess_answer *a = sess_last_answer(want), *b = sess_last_answer(s);
    cr_expect(a->n_ids == b->n_ids && !memcmp(a->ids, b->ids, sizeof(int32_t) * (size_t)a->n_ids),
              "%s: the answers differ ('%s' against '%s')", what, b->text, a->text);
}

static int64_t replayed(const session *s)
{
    run_figures f;
    run_get_figures(sess_run(s), &f);
    return f.replayed;
}

static int64_t prefilled(const session *s)
{
    run_figures f;
    run_get_figures(sess_run(s), &f);
    return f.prefill_tokens;
}

static volatile sig_atomic_t stop_flag;
static int64_t stop_after = -1;   /* the comparison's tokens (every column's) at which Ctrl-C comes */
static void stop_in_column(void *ud, int i, int n, const char *policy, int64_t tokens)
{
    (void)ud;
    (void)i;
    (void)n;
    (void)policy;
    if (stop_after >= 0 && tokens >= stop_after) stop_flag = 1;
}

Test(reuse, a_comparison_finished_or_cancelled_leaves_the_cache_without_reading_it_again)
{
    fixture x;
    fixture_open(&x);
    session *s = open_session("full", &x.f.sp);
    session *c = open_session("full", NULL);   /* the control never compares */
    cr_assert(sess_open_document(s, x.f.doc, NULL, NULL, 0) == SESS_OK);
    cr_assert(sess_open_document(c, x.f.doc, NULL, NULL, 0) == SESS_OK);
    ask_ok(s, "What is it about?");
    ask_ok(c, "What is it about?");
    int64_t pos0 = run_pos(sess_run(s)), r0 = replayed(s);
    const char *specs[] = { "quest", "chess" };
    sess_compared out[8];
    int n_out = 0;
    cr_assert_eq(sess_compare(s, specs, 2, "Who wrote it?", out, &n_out), SESS_OK, "%s", sess_error(s));
    cr_expect_eq(n_out, 3);
    int64_t whole = 0;
    for (int i = 0; i < n_out; i++) {
        whole += out[i].n_tokens;
        free(out[i].text);
    }
    cr_expect_eq(run_pos(sess_run(s)), pos0, "the cache is back where the comparison began");
    cr_expect_eq(replayed(s), r0, "%lld positions were evaluated again", (long long)(replayed(s) - r0));
    /* Ctrl-C once the columns hold 6 tokens in all, mid-decoding: the flag stays raised while the
     * comparison unwinds */
    sess_callbacks cb = { 0 };
    cb.column = stop_in_column;
    stop_flag = 0;
    stop_after = 6;
    sess_set_callbacks(s, &cb, &stop_flag);
    cr_expect_eq(sess_compare(s, specs, 2, "Who wrote it?", out, &n_out), SESS_OK, "%s", sess_error(s));
    int64_t cut = 0;
    for (int i = 0; i < n_out; i++) {
        cut += out[i].n_tokens;
        free(out[i].text);
    }
    /* the columns are decoded together: each keeps what it had when the flag rose */
    cr_expect(n_out == 3 && cut >= 6 && cut < 6 + 3 && cut < whole, "%d answers of %lld tokens, %lld uncancelled",
              n_out, (long long)cut, (long long)whole);
    cr_expect_eq(run_pos(sess_run(s)), pos0, "a cancelled comparison leaves the cache as it was");
    cr_expect_eq(replayed(s), r0, "%lld positions were evaluated again", (long long)(replayed(s) - r0));
    stop_flag = 0;
    sess_set_callbacks(s, NULL, NULL);
    /* and the conversation goes on exactly as the control's */
    ask_ok(s, "Who wrote it?");
    ask_ok(c, "Who wrote it?");
    expect_same_answer(c, s, "after the comparisons");
    cr_expect_eq(sess_last_answer(s)->prompt_tokens, sess_last_answer(c)->prompt_tokens,
                 "only the question is read after the comparisons");
    sess_free(c);
    sess_free(s);
    sess_fixture_close(&x.f);
}

static char notes[8192];   /* the notes since they were last cleared, one a line */
static void keep_note(void *ud, const char *msg)
{
    (void)ud;
    size_t n = strlen(notes);
    snprintf(notes + n, sizeof notes - n, "%s\n", msg);
}

static void listen(session *s)
{
    static sess_callbacks cb;
    memset(&cb, 0, sizeof cb);
    cb.note = keep_note;
    notes[0] = 0;
    sess_set_callbacks(s, &cb, NULL);
}

Test(reuse, a_document_read_once_is_restored_when_the_same_text_is_opened_again)
{
    fixture x;
    fixture_open(&x);
    session *a = open_session("full", &x.f.sp);
    cr_assert(sess_open_document(a, x.f.doc, NULL, NULL, 0) == SESS_OK, "%s", sess_error(a));
    cr_expect_gt(prefilled(a), 800, "the first open reads the document");
    ask_ok(a, "What is it about?");
    /* another file with the same text, in another session object: nothing is read */
    session *b = open_session("full", &x.f.sp);
    listen(b);
    cr_assert(sess_open_document(b, x.copy, NULL, NULL, 0) == SESS_OK, "%s", sess_error(b));
    cr_expect_eq(prefilled(b), 0, "the same text was read again (%lld tokens)", (long long)prefilled(b));
    cr_expect(strstr(notes, "read before: restored from its snapshot under full"), "notes: %s", notes);
    cr_expect_eq(run_pos(sess_run(b)), sess_document_tokens(b));
    ask_ok(b, "What is it about?");
    expect_same_answer(a, b, "from the document's snapshot");
    /* a session opened and left without a question resumes from it too */
    session *c = open_session("full", &x.f.sp);
    cr_assert(sess_open_document(c, x.f.doc, NULL, "left-alone", 0) == SESS_OK, "%s", sess_error(c));
    sess_free(c);
    c = open_session("full", &x.f.sp);
    listen(c);
    sess_resume_opts o = { 0, 0, SESS_FORMAT_AUTO, NULL };
    cr_assert(sess_resume(c, "left-alone", &o) == SESS_OK, "%s", sess_error(c));
    cr_expect_eq(prefilled(c), 0, "the resumed document was read again (%lld tokens)", (long long)prefilled(c));
    cr_expect(strstr(notes, "the document's snapshot restored"), "notes: %s", notes);
    ask_ok(c, "What is it about?");
    expect_same_answer(a, c, "resumed from the document's snapshot");
    /* opened again before any question: the same stored session goes on, no second empty one */
    session *e = open_session("full", &x.f.sp);
    cr_assert(sess_open_document(e, x.f.doc, NULL, NULL, 0) == SESS_OK, "%s", sess_error(e));
    int64_t first = sess_stored_id(e);
    cr_assert(sess_open_document(e, x.f.doc, NULL, NULL, 0) == SESS_OK, "%s", sess_error(e));
    cr_expect_eq(sess_stored_id(e), first, "a second empty session about the same document");
    ask_ok(e, "What is it about?");
    cr_assert(sess_open_document(e, x.f.doc, NULL, NULL, 0) == SESS_OK, "%s", sess_error(e));
    cr_expect_neq(sess_stored_id(e), first, "a conversation with a question is never reused");
    sess_free(e);
    /* under another prefill policy the document is read (its cache differs) */
    session *d = open_session("snapkv:budget=0.5", &x.f.sp);
    cr_assert(sess_open_document(d, x.copy, NULL, NULL, 0) == SESS_OK, "%s", sess_error(d));
    cr_expect_gt(prefilled(d), 800, "snapkv's cache is not full's");
    sess_free(d);
    sess_free(c);
    sess_free(b);
    sess_free(a);
    sess_fixture_close(&x.f);
}

Test(reuse, switching_back_to_a_policy_reads_only_what_came_after_its_last_snapshot)
{
    fixture x;
    fixture_open(&x);
    session *s = open_session("full", &x.f.sp);
    cr_assert(sess_open_document(s, x.f.doc, NULL, NULL, 0) == SESS_OK, "%s", sess_error(s));
    ask_ok(s, "What is it about?");
    cr_assert(sess_set_policy(s, "snapkv:budget=0.5", NULL) == SESS_OK, "%s", sess_error(s));
    ask_ok(s, "Who wrote it?");
    int64_t total = run_pos(sess_run(s));
    listen(s);
    cr_assert(sess_set_policy(s, "full", NULL) == SESS_OK, "%s", sess_error(s));
    cr_expect(strstr(notes, "the snapshot after answer 1 under full restored"), "notes: %s", notes);
    cr_expect_eq(run_pos(sess_run(s)), total, "the cache holds the whole conversation");
    cr_expect_gt(prefilled(s), 0);
    cr_expect_lt(prefilled(s), 100, "%lld of %lld tokens read again", (long long)prefilled(s), (long long)total);
    ask_ok(s, "And then?");
    sess_free(s);
    sess_fixture_close(&x.f);
}

/* A prefill policy chosen before the first question compresses with that question in view, as a
 * document opened under it does (and as `ask` does): the first answer is ask's. */
Test(reuse, a_prefill_policy_chosen_before_the_first_question_waits_for_it)
{
    fixture x;
    fixture_open(&x);
    session *s = open_session("full", &x.f.sp);
    cr_assert(sess_open_document(s, x.f.doc, NULL, NULL, 0) == SESS_OK, "%s", sess_error(s));
    cr_assert(sess_set_policy(s, "snapkv:budget=0.3", NULL) == SESS_OK, "%s", sess_error(s));
    cr_expect_eq(run_pos(sess_run(s)), 0, "the document waits for the question");
    ask_ok(s, "Who wrote it?");
    session *a = open_session("snapkv:budget=0.3", NULL);   /* ask: the document deferred */
    cr_assert(sess_open_document(a, x.f.doc, NULL, NULL, 1) == SESS_OK, "%s", sess_error(a));
    ask_ok(a, "Who wrote it?");
    expect_same_answer(a, s, "the first answer after the switch");
    cr_expect_eq(sess_last_answer(s)->prompt_tokens, sess_last_answer(a)->prompt_tokens);
    sess_free(a);
    sess_free(s);
    sess_fixture_close(&x.f);
}

static char past_log[4096];
static void keep_past(void *ud, const char *role, const char *text)
{
    (void)ud;
    size_t n = strlen(past_log);
    snprintf(past_log + n, sizeof past_log - n, "%s: %s\n", role, text);
}

/* A question whose process was killed before its answer (kill -9) is in the store; a resume shows
 * it, last, marked as not answered, and the conversation goes on from the answer before it. */
Test(reuse, a_question_left_without_an_answer_is_shown_when_resumed)
{
    fixture x;
    fixture_open(&x);
    session *s = open_session("full", &x.f.sp);
    cr_assert(sess_open_document(s, x.f.doc, NULL, "killed", 0) == SESS_OK, "%s", sess_error(s));
    ask_ok(s, "What is it about?");
    int64_t id;
    cr_assert(store_message_add(x.f.db, sess_stored_id(s), sess_last_answer(s)->answer_msg, "user",
                                "Which question was cut off?", "full", NULL, &id) == 0, "%s", store_error(x.f.db));
    sess_free(s);
    s = open_session("full", &x.f.sp);
    sess_callbacks cb = { 0 };
    cb.note = keep_note;
    cb.past = keep_past;
    notes[0] = past_log[0] = 0;
    sess_set_callbacks(s, &cb, NULL);
    cr_assert(sess_resume(s, "killed", NULL) == SESS_OK, "%s", sess_error(s));
    const char *q = strstr(past_log, "user: Which question was cut off?");
    cr_expect(q && !strchr(q, '\n')[1], "the unanswered question is shown last: %s", past_log);
    cr_expect(strstr(notes, "no answer: interrupted"), "notes: %s", notes);
    cr_expect_eq(sess_turns(s), 1, "the conversation goes on from the answer before it");
    sess_free(s);
    sess_fixture_close(&x.f);
}

/* The database's size limit counts document snapshots and prunes them with the rest, oldest first
 * (a document's by when it was last used), never the one just saved. */
Test(reuse, the_size_limit_prunes_document_snapshots_too)
{
    fixture x;
    fixture_open(&x);
    cr_assert(store_limit_set(x.f.db, 1) == 0, "%s", store_error(x.f.db));   /* every save prunes the rest */
    session *s = open_session("full", &x.f.sp);
    cr_assert(sess_open_document(s, x.f.doc, NULL, NULL, 0) == SESS_OK, "%s", sess_error(s));
    session *b = open_session("full", &x.f.sp);
    cr_assert(sess_open_document(b, x.copy, NULL, NULL, 0) == SESS_OK, "%s", sess_error(b));
    cr_expect_eq(prefilled(b), 0, "the document snapshot just saved stays");
    ask_ok(s, "What is it about?");   /* its snapshot is the newest: the document's goes */
    session *c = open_session("full", &x.f.sp);
    cr_assert(sess_open_document(c, x.copy, NULL, NULL, 0) == SESS_OK, "%s", sess_error(c));
    cr_expect_gt(prefilled(c), 800, "the pruned document snapshot was still restored");
    store_usage u;
    cr_assert(store_usage_get(x.f.db, &u) == 0, "%s", store_error(x.f.db));
    cr_expect_gt(u.pruned, 0);
    sess_free(c);
    sess_free(b);
    sess_free(s);
    sess_fixture_close(&x.f);
}
