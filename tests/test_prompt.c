/* test_prompt.c - where a plain-form answer ends (engine/prompt.h): the plain form's own stop
 * sequences, and the ones a session answers with under each --answer-end choice, on the tiny Gemma
 * model (its file has no chat template, so the plain form is also its default form). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "engine/prompt.h"
#include "engine/session.h"

#define MODEL "../shared/testdata/tiny/tiny-gemma3-q4_k_m.gguf"

static int has(const char *const *v, int n, const char *want)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(v[i], want)) return 1;
    return 0;
}

Test(prompt, a_plain_answer_ends_at_its_paragraph_or_line_or_the_next_question)
{
    const char *v[4];
    int n = prompt_plain_stops(PROMPT_END_LINE, v, 4);
    cr_expect_eq(n, 2);
    cr_expect(has(v, n, "\nQuestion:") && has(v, n, "\n"), "the line form stops at a line break and the next question");
    n = prompt_plain_stops(PROMPT_END_PARAGRAPH, v, 4);
    cr_expect(n == 2 && has(v, n, "\nQuestion:") && has(v, n, "\n\n") && !has(v, n, "\n"),
              "the paragraph form stops at a blank line and the next question");
    n = prompt_plain_stops(PROMPT_END_TURN, v, 4);
    cr_expect_eq(n, 1);
    cr_expect_str_eq(v[0], "\nQuestion:", "the turn form stops at the next question only");
    cr_expect_eq(prompt_plain_stops(PROMPT_END_LINE, v, 1), 1, "no more than max");
    cr_expect_eq(prompt_plain_stops(PROMPT_END_LINE, v, 0), 0);
}

static session *open_session(int format, int answer_end, const char *stop)
{
    run_config rc;
    memset(&rc, 0, sizeof rc);
    rc.model_path = MODEL;
    rc.device = BE_DEVICE_CPU;
    rc.n_threads = 1;
    rc.n_ctx = 512;
    char err[600];
    cr_assert(pol_parse(&rc.policy, "full", NULL, err, sizeof err) == 0, "%s", err);
    rc.sp = samp_params_default();
    rc.sp.temperature = 0;
    run *r = run_create(&rc, err, sizeof err);
    cr_assert(r, "%s", err);
    sess_config c;
    memset(&c, 0, sizeof c);
    c.n_predict = 48;
    c.format = format;
    c.answer_end = answer_end;
    if (stop) snprintf(c.stop[c.n_stop++], sizeof c.stop[0], "%s", stop);
    session *s = sess_create(r, &c, err, sizeof err);
    cr_assert(s, "%s", err);
    return s;
}

Test(prompt, a_sessions_answers_stop_as_its_answer_end_says)
{
    const char *v[SESS_MAX_STOP + 2];
    /* the default configuration (zeroed): a plain answer ends at its paragraph */
    session *s = open_session(SESS_FORMAT_AUTO, 0, "END");
    cr_assert_eq(sess_format(s), SESS_FORMAT_PLAIN, "the tiny Gemma model has no chat template");
    int n = sess_stops(s, 1, v, SESS_MAX_STOP + 2);
    cr_expect_eq(n, 3);
    cr_expect(has(v, n, "\n\n") && has(v, n, "\nQuestion:") && has(v, n, "END"),
              "the blank line, the next question, --stop");
    cr_expect_eq(sess_stops(s, 0, v, SESS_MAX_STOP + 2), 1, "a raw continuation has the configured stops only");
    sess_free(s);
    s = open_session(SESS_FORMAT_PLAIN, PROMPT_END_TURN, NULL);
    n = sess_stops(s, 1, v, SESS_MAX_STOP + 2);
    cr_expect(n == 1 && !strcmp(v[0], "\nQuestion:"), "--answer-end turn: the next question only");
    sess_free(s);
    /* the chat template ends its turns itself */
    s = open_session(SESS_FORMAT_PLAIN, PROMPT_END_LINE, NULL);
    n = sess_stops(s, 1, v, SESS_MAX_STOP + 2);
    cr_expect(n == 2 && has(v, n, "\n"), "--answer-end line: the line break");
    sess_free(s);
    s = open_session(SESS_FORMAT_CHAT, PROMPT_END_PARAGRAPH, NULL);
    cr_expect_eq(sess_stops(s, 1, v, SESS_MAX_STOP + 2), 0);
    sess_free(s);
}
