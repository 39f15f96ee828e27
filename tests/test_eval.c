/* test_eval.c - the eval harness without the default model: task generators (deterministic, needles
 * at the asked depth, answers present in the document), the answer checker, the CSV round trip and
 * resume lookup, the Markdown summary, a plot, and `kvchat eval` end to end on a tiny model (bad
 * input, and a second run skipping every row the first one wrote).
 *
 * The unit-test binary links the app/ and ui/ objects (all but main.o). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "app/eval/docgen.h"
#include "app/eval/evalplot.h"
#include "app/eval/evalres.h"
#include "app/eval/tasks.h"

#define TD "../shared/testdata/"

static filler gen_filler(void)
{
    filler f;
    cr_assert(filler_generated(&f, 200000, 7) == 0);
    return f;
}

Test(eval_tasks, generators_are_deterministic_for_a_seed)
{
    filler f = gen_filler();
    char err[256];
    for (const char *const *t = task_names(); *t; t++) {
        task_item a, b, c;
        cr_assert(task_make(*t, &f, 1000, 4.0, 3, 1, 5, &a, err, sizeof err) == 0, "%s: %s", *t, err);
        cr_assert(task_make(*t, &f, 1000, 4.0, 3, 1, 5, &b, err, sizeof err) == 0);
        cr_assert(task_make(*t, &f, 1000, 4.0, 3, 2, 5, &c, err, sizeof err) == 0);
        cr_expect_str_eq(a.doc, b.doc, "%s: same seed and sample, different documents", *t);
        cr_expect_str_eq(a.question[0], b.question[0]);
        cr_expect_str_eq(a.expect[0][0], b.expect[0][0]);
        cr_expect(strcmp(a.doc, c.doc) != 0, "%s: samples 1 and 2 gave the same document", *t);
        task_item_free(&a);
        task_item_free(&b);
        task_item_free(&c);
    }
    filler_done(&f);
}

Test(eval_tasks, needle_lands_at_the_asked_depth)
{
    filler f = gen_filler();
    char err[256];
    for (int k = 0; k < 5; k++) {
        task_item it;
        cr_assert(task_make("niah", &f, 2000, 4.0, 1, k, 5, &it, err, sizeof err) == 0, "%s", err);
        double want = k / 4.0;
        const char *mark = "The special magic number for";
        const char *at = strstr(it.doc, mark);
        cr_assert(at, "sample %d: no needle in the document", k);
        double got = (double)(at - it.doc) / (double)strlen(it.doc);
        cr_expect(fabs(got - want) < 0.02, "sample %d: needle at %.3f of the document, asked %.2f", k, got, want);
        cr_expect(fabs(it.depth[0] - got) < 1e-9, "recorded depth %.4f, actual %.4f", it.depth[0], got);
        cr_expect(strstr(it.doc, it.expect[0][0]), "the value %s is not in the document", it.expect[0][0]);
        cr_expect(!strstr(at + 1, mark), "more than one needle");
        /* about 2000 tokens of 4 characters */
        cr_expect(strlen(it.doc) > 7600 && strlen(it.doc) < 8600, "document of %zu characters", strlen(it.doc));
        task_item_free(&it);
    }
    filler_done(&f);
}

/* The standard pass-key documents: the Landmark filler repeated to the asked length, the needle once at
 * the inner sweep's depth, and keys that really differ from sample to sample (the passkey task's keys
 * move by a unit every few samples: its generator is kept as it was for older results). */
Test(eval_tasks, passkey_std_has_one_needle_at_the_sweep_depth_and_random_keys)
{
    filler f = gen_filler();
    char err[256], keys[20][24];
    const char *fill = task_own_filler("passkey-std");
    cr_assert(fill && strstr(fill, "The grass is green.") && !task_own_filler("niah"));
    int distinct_first_digits = 0, seen[10] = { 0 };
    for (int k = 0; k < 20; k++) {
        task_item it;
        cr_assert(task_make("passkey-std", &f, 2048, 3.7, 1, k, 5, &it, err, sizeof err) == 0, "%s", err);
        const char *key = it.expect[0][0];
        cr_assert(strlen(key) == 5, "key '%s' is not five digits", key);
        snprintf(keys[k], sizeof keys[k], "%s", key);
        if (!seen[key[0] - '0']++) distinct_first_digits++;
        char needle[96];
        snprintf(needle, sizeof needle, "The pass key is %s. Remember it. %s is the pass key.", key, key);
        const char *at = strstr(it.doc, needle);
        cr_assert(at, "sample %d: no needle", k);
        cr_expect(strstr(it.doc, "pass key") == at + 4 && !strstr(at + strlen(needle), "pass key"),
                  "sample %d: more than one needle", k);
        cr_expect(at == it.doc || at[-1] == ' ', "the needle starts a sentence");
        double got = (double)(at - it.doc) / (double)strlen(it.doc);
        cr_expect(fabs(got - task_inner_depth(k, 5)) < 0.02, "sample %d: needle at %.3f, asked %.2f", k, got,
                  task_inner_depth(k, 5));
        cr_expect(fabs(it.depth[0] - got) < 1e-9);
        cr_expect_str_eq(it.question[0], "What is the pass key?");
        /* about 2048 tokens of 3.7 characters, every other sentence the filler's */
        size_t len = strlen(it.doc);
        cr_expect(len > 7200 && len < 8000, "document of %zu characters", len);
        cr_expect(!strncmp(it.doc, at == it.doc ? needle : fill, strlen(at == it.doc ? needle : fill)));
        cr_expect(it.doc[len - 1] == '.' && !strstr(it.doc, "  "), "pieces joined by single spaces");
        task_item_free(&it);
    }
    int same = 0;
    for (int a = 0; a < 20; a++)
        for (int b = a + 1; b < 20; b++) same += !strcmp(keys[a], keys[b]);
    cr_expect(same <= 1, "%d pairs of the 20 samples share a key", same);
    cr_expect(distinct_first_digits >= 5, "keys start with only %d different digits", distinct_first_digits);
    cr_expect(fabs(task_inner_depth(0, 5) - 0.1) < 1e-12 && fabs(task_inner_depth(4, 5) - 0.9) < 1e-12);
    filler_done(&f);
}

Test(eval_tasks, every_question_has_its_answer_in_the_document)
{
    filler f = gen_filler();
    char err[256];
    const char *tasks[] = { "passkey", "passkey-std", "multikey", "multivalue", "babi1", "babi2", "multiturn" };
    for (int t = 0; t < 7; t++)
        for (int k = 0; k < 6; k++) {
            task_item it;
            cr_assert(task_make(tasks[t], &f, 800, 4.0, 9, k, 5, &it, err, sizeof err) == 0);
            cr_assert(it.n_q >= 1 && it.n_q <= TASK_MAX_Q);
            for (int q = 0; q < it.n_q; q++) {
                cr_expect(it.question[q][0] && it.n_expect[q] >= 1, "%s #%d: question %d is empty", tasks[t], k, q);
                for (int v = 0; v < it.n_expect[q]; v++)
                    cr_expect(strstr(it.doc, it.expect[q][v]), "%s #%d: %s is not in the document", tasks[t], k,
                              it.expect[q][v]);
                cr_expect(it.depth[q] >= 0 && it.depth[q] <= 1, "%s: depth %f", tasks[t], it.depth[q]);
            }
            task_item_free(&it);
        }
    filler_done(&f);
}

Test(eval_tasks, multikey_has_distractors_and_multiturn_asks_three_keys)
{
    filler f = gen_filler();
    char err[256];
    task_item it;
    cr_assert(task_make("multikey", &f, 1000, 4.0, 1, 0, 5, &it, err, sizeof err) == 0);
    int n = 0;
    for (const char *s = it.doc; (s = strstr(s, "The special magic number for")); s++) n++;
    cr_expect_eq(n, 4, "multikey: %d needles", n);
    task_item_free(&it);
    cr_assert(task_make("multiturn", &f, 1000, 4.0, 1, 0, 5, &it, err, sizeof err) == 0);
    cr_expect_eq(it.n_q, 3);
    cr_expect(strcmp(it.question[0], it.question[1]) && strcmp(it.question[1], it.question[2]));
    task_item_free(&it);
    filler_done(&f);
}

Test(eval_tasks, babi2_answer_is_where_the_holder_went_after_picking_up)
{
    filler f = gen_filler();
    char err[256];
    for (int k = 0; k < 10; k++) {
        task_item it;
        cr_assert(task_make("babi2", &f, 800, 4.0, 5, k, 5, &it, err, sizeof err) == 0);
        const char *pick = strstr(it.doc, " picked up the ");
        cr_assert(pick, "no pick-up fact");
        const char *name = pick;
        while (name > it.doc && name[-1] != ' ') name--;
        char who[32], went[128];
        snprintf(who, sizeof who, "%.*s", (int)(pick - name), name);
        snprintf(went, sizeof went, "%s went to the %s.", who, it.expect[0][0]);
        const char *after = strstr(pick, went);
        cr_expect(after, "#%d: %s never went to the %s after the pick-up", k, who, it.expect[0][0]);
        task_item_free(&it);
    }
    filler_done(&f);
}

Test(eval_tasks, ppl_continuation_follows_the_document_in_the_filler)
{
    filler f = gen_filler();
    char err[256];
    task_item it;
    cr_assert(task_make("ppl", &f, 500, 4.0, 2, 0, 5, &it, err, sizeof err) == 0);
    cr_assert(it.kind == TASK_LOGLIK && it.cont && strlen(it.cont) > 400);
    size_t ld = strlen(it.doc);
    char *both = malloc(ld + strlen(it.cont) + 1);
    strcpy(both, it.doc);
    strcat(both, it.cont);
    cr_expect(strstr(f.text, both), "document + continuation is not running text of the filler");
    free(both);
    task_item_free(&it);
    filler_done(&f);
}

/* A ppl sample is its passage: 64 samples of a 1 MB filler never share a character of what they
 * read or score (independent seeded starts overlapped about five pairs of 20 of 200 KB; a spread
 * whose offset moved with the sample, two of 64 of 1 MB). */
Test(eval_tasks, ppl_samples_never_share_text)
{
    filler f;
    cr_assert(filler_generated(&f, 1000000, 7) == 0);
    char err[256];
    enum { N = 64 };
    size_t from[N], to[N];
    for (int k = 0; k < N; k++) {
        task_item it;
        cr_assert(task_make("ppl", &f, 500, 4.0, 3, k, 5, &it, err, sizeof err) == 0, "%s", err);
        const char *at = strstr(f.text, it.doc);
        cr_assert(at, "sample %d's document is not running text of the filler", k);
        from[k] = (size_t)(at - f.text);
        to[k] = from[k] + strlen(it.doc) + strlen(it.cont);
        task_item_free(&it);
    }
    for (int a = 0; a < N; a++)
        for (int b = a + 1; b < N; b++)
            cr_expect(to[a] <= from[b] || to[b] <= from[a], "samples %d and %d share text: %zu-%zu and %zu-%zu", a, b,
                      from[a], to[a], from[b], to[b]);
    filler_done(&f);
}

Test(eval_tasks, unknown_task_is_an_error)
{
    filler f = gen_filler();
    char err[256] = "";
    task_item it;
    cr_expect(task_make("nosuch", &f, 500, 4.0, 2, 0, 5, &it, err, sizeof err) == -1);
    cr_expect(strstr(err, "nosuch"));
    filler_done(&f);
}

Test(eval_check, numbers_must_appear_whole)
{
    const char *one[] = { "1234567" };
    cr_expect(task_numbers_present(" The number is 1234567.", one, 1));
    cr_expect(task_numbers_present(" 1,234,567", one, 1), "thousands separators are dropped");
    cr_expect(!task_numbers_present(" 12345678", one, 1), "a longer number is not the value");
    cr_expect(!task_numbers_present(" 123456", one, 1));
    cr_expect(!task_numbers_present("", one, 1));
    const char *two[] = { "1111111", "2222222" };
    cr_expect(task_numbers_present("2222222 and 1111111", two, 2));
    cr_expect(!task_numbers_present("1111111 only", two, 2), "every value of a multi-value answer is needed");
}

Test(eval_check, the_first_place_named_decides)
{
    cr_expect(task_first_place_is(" Mary is in the kitchen, not the garden.", "kitchen"));
    cr_expect(!task_first_place_is(" Mary is in the kitchen, not the garden.", "garden"));
    cr_expect(task_first_place_is(" The GARDEN", "garden"), "case does not matter");
    cr_expect(!task_first_place_is(" the kitchens", "kitchen"), "a whole word only");
    cr_expect(!task_first_place_is(" in the hall", "kitchen"));
}

/* The Markdown summary of rs, as a string to search (free it). */
static char *summary_of(const eval_recs *rs)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert(f);
    evalres_summary_md(f, rs);
    fclose(f);
    return buf;
}

static void rec(eval_rec *r, const char *task, int sample, const char *policy, const char *budget, int correct,
                int control)
{
    evalres_init(r);
    snprintf(r->task, sizeof r->task, "%s", task);
    r->ctx = 2048;
    r->tokens = 2060;
    r->sample = sample;
    r->depth = 0.5;
    snprintf(r->policy, sizeof r->policy, "%s", policy);
    snprintf(r->budget, sizeof r->budget, "%s", budget);
    r->correct = correct;
    r->control = control;
    r->kv_bytes = 1 << 20;
    r->kv_peak = 2 << 20;
    r->answer_tokens = 10;
    r->decode_s = 0.5;
    r->seconds = 2;
}

Test(eval_results, csv_round_trip_and_resume_lookup)
{
    char path[] = "/tmp/kvchat-evalres-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs(evalres_header, f);
    eval_rec a, b;
    rec(&a, "niah", 0, "snapkv:window=16,kernel=5", "0.1", 1, 0);
    snprintf(a.answer, sizeof a.answer, " 1234567, \"quoted\", and more");
    rec(&b, "ppl", 1, "full", "-", -1, -1);
    b.ppl = 7.25;
    evalres_write(f, &a);
    evalres_write(f, &b);
    fputs("niah,2048,2060,2,0.5,0,\"full\",-,0,1", f);   /* a row cut short by an interrupted write */
    fclose(f);
    eval_recs rs = { 0 };
    char err[256];
    cr_assert(evalres_read(path, &rs, err, sizeof err) == 0, "%s", err);
    cr_assert_eq(rs.n, 2, "%zu rows read (the cut row must be run again)", rs.n);
    cr_expect_str_eq(rs.v[0].policy, a.policy);
    cr_expect_str_eq(rs.v[0].answer, a.answer);
    cr_expect_eq(rs.v[0].correct, 1);
    cr_expect_eq(rs.v[0].control, 0);
    cr_expect(isnan(rs.v[0].ppl));
    cr_expect(fabs(rs.v[1].ppl - 7.25) < 1e-9);
    cr_expect_eq(rs.v[1].correct, -1);
    cr_expect(evalres_find(&rs, "niah", 2048, 0, 0, a.policy, "0.1", 0) == 0);
    cr_expect(evalres_find(&rs, "niah", 2048, 0, 0, a.policy, "0.2", 0) == -1, "another budget is not done");
    cr_expect(evalres_find(&rs, "niah", 4096, 0, 0, a.policy, "0.1", 0) == -1, "another length is not done");
    cr_expect(evalres_find(&rs, "niah", 2048, 2, 0, "full", "-", 0) == -1, "the cut row is not done");
    evalres_free(&rs);
    unlink(path);
}

/* A CSV is bytes from anywhere: what the summary prints of it (task, policy, budget, status) reaches
 * a terminal under `eval --report`, so its control bytes come back escaped, never raw. */
Test(eval_results, control_bytes_in_a_csv_are_escaped_on_reading)
{
    char path[] = "/tmp/kvchat-evalres-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "w");
    cr_assert(f);
    fputs(evalres_header, f);
    fputs("niah\x07,2048,2060,0,0.5,0,chess\x1b[2J,0.1\x9b,-1,2147483647,0,,\" 1\",\"1\",4,1,1,1,0,0,0,ok\x1b]0;x\n", f);
    fclose(f);
    eval_recs rs = { 0 };
    char err[256] = "";
    cr_assert(evalres_read(path, &rs, err, sizeof err) == 0 && rs.n == 1, "%s", err);
    cr_expect_str_eq(rs.v[0].task, "niah\\x07");
    cr_expect_str_eq(rs.v[0].policy, "chess\\x1b[2J");
    cr_expect_str_eq(rs.v[0].budget, "0.1\\x9b");
    cr_expect_str_eq(rs.v[0].status, "ok\\x1b]0;x");
    cr_expect_eq(rs.v[0].correct, 1, "a count is 0 or 1 (summing INT_MAX twice overflowed): %d", rs.v[0].correct);
    char *buf = summary_of(&rs);
    for (size_t i = 0; buf[i]; i++)
        cr_expect(buf[i] == '\n' || ((unsigned char)buf[i] >= 0x20 && buf[i] != 0x7f), "byte %zu is %#x", i,
                  (unsigned char)buf[i]);
    free(buf);
    evalres_free(&rs);
    unlink(path);
}

Test(eval_results, a_csv_of_something_else_is_refused)
{
    char path[] = "/tmp/kvchat-evalres-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert(write(fd, "a,b,c\n1,2,3\n", 12) == 12);
    close(fd);
    eval_recs rs = { 0 };
    char err[256] = "";
    cr_expect(evalres_read(path, &rs, err, sizeof err) == -1);
    cr_expect(strstr(err, "not a kvchat eval CSV"), "%s", err);
    evalres_free(&rs);
    unlink(path);
    cr_expect(evalres_read("/nonexistent/x.csv", &rs, err, sizeof err) == 0 && rs.n == 0, "no file: nothing done");
}

Test(eval_results, markdown_summary_counts_answers_and_retrievals)
{
    eval_recs rs = { 0 };
    eval_rec r;
    rec(&r, "niah", 0, "nodoc", "-", 0, -1);
    evalres_push(&rs, &r);
    rec(&r, "niah", 1, "nodoc", "-", 1, -1);
    evalres_push(&rs, &r);
    rec(&r, "niah", 0, "full", "-", 1, 0);
    evalres_push(&rs, &r);
    rec(&r, "niah", 1, "full", "-", 1, 1);   /* known without the document: answered, not retrieved */
    evalres_push(&rs, &r);
    rec(&r, "niah", 0, "snapkv", "0.1", 0, 0);
    evalres_push(&rs, &r);
    rec(&r, "niah", 1, "snapkv", "0.1", 1, 1);
    evalres_push(&rs, &r);
    rec(&r, "niah", 0, "snapkv", "0.01", -1, 0);
    snprintf(r.status, sizeof r.status, "refused: budget below the window");
    evalres_push(&rs, &r);
    rec(&r, "ppl", 0, "full", "-", -1, -1);
    r.ppl = 8.0;
    evalres_push(&rs, &r);
    rec(&r, "ppl", 0, "snapkv", "0.1", -1, -1);
    r.ppl = 9.5;
    evalres_push(&rs, &r);
    rec(&r, "ppl", 1, "full", "-", -1, -1);   /* an easy document four times worse */
    r.ppl = 2.0;
    evalres_push(&rs, &r);
    rec(&r, "ppl", 1, "snapkv", "0.1", -1, -1);
    r.ppl = 8.0;
    evalres_push(&rs, &r);
    rec(&r, "babi1", 0, "full", "-", 1, 0);   /* only the full cache ran it: not in the pooled table */
    evalres_push(&rs, &r);
    char *buf = summary_of(&rs);
    cr_expect(strstr(buf, "| niah | 2048 | full | - | 0 | 2 | 2/2 | 1/2 |"), "%s", buf);
    cr_expect(strstr(buf, "| niah | 2048 | snapkv | 0.1 | 0 | 2 | 1/2 | 0/2 |"), "%s", buf);
    cr_expect(strstr(buf, "| niah | 2048 | snapkv | 0.01 | 0 | 0 | n/a (budget refused)"), "%s", buf);
    /* ppl vs full pairs the documents: sqrt(9.5/8 x 8/2) = 2.179 (the means' ratio would say 1.75) */
    cr_expect(strstr(buf, "| ppl | 2048 | snapkv | 0.1 | 0 | 2 | - | - | 8.750 | +3.750 | +117.9% |"), "%s", buf);
    cr_expect(strstr(buf, "| full | 1/2 (50%) |"), "pivot row of full (babi1 left out):\n%s", buf);
    cr_expect(strstr(buf, "| babi1 | 2048 | full | - | 0 | 1 | 1/1 | 1/1 |"), "%s", buf);
    cr_expect(strstr(buf, "| snapkv | | | 0/2 (0%) |"), "pivot row of snapkv (0.01 refused):\n%s", buf);
    cr_expect(strstr(buf, "| niah | 2048 | nodoc | - | 0 | 2 | 1/2 | - |"), "the control has no retrievals:\n%s", buf);
    /* nodoc sorts before the policies within a task and length */
    cr_expect(strstr(buf, "| niah | 2048 | nodoc") < strstr(buf, "| niah | 2048 | full"));
    free(buf);
    evalres_free(&rs);
}

/* The per-task tables a results page quotes: policy x (length, budget), a configuration without a
 * budget filling every column of its length, a missing or refused one left empty, backtrack variants
 * apart, and for ppl the paired change against the full cache (its own row: the mean perplexity). */
Test(eval_results, markdown_summary_pivots_each_task_by_length_and_budget)
{
    eval_recs rs = { 0 };
    eval_rec r;
    for (int ctx = 2048; ctx <= 4096; ctx *= 2)
        for (int s = 0; s < 2; s++) {
            rec(&r, "niah", s, "full", "-", ctx == 2048 || s == 0, 0);
            r.ctx = ctx;
            evalres_push(&rs, &r);
            rec(&r, "niah", s, "nodoc", "-", 0, -1);   /* after full in the run, first in the table */
            r.ctx = ctx;
            evalres_push(&rs, &r);
            rec(&r, "niah", s, "chess", "0.05", s == 0, 0);
            r.ctx = ctx;
            r.backtrack = 0;
            evalres_push(&rs, &r);
            rec(&r, "niah", s, "chess", "0.05", 1, 0);
            r.ctx = ctx;
            r.backtrack = 1;
            evalres_push(&rs, &r);
            rec(&r, "niah", s, "snapkv", ctx == 2048 ? "0.1" : "0.05", 1, 0);
            r.ctx = ctx;
            if (ctx == 4096 && s == 1) snprintf(r.status, sizeof r.status, "refused: budget below the window");
            evalres_push(&rs, &r);
        }
    double full[2] = { 8.0, 2.0 }, snap[2] = { 9.5, 8.0 }, nodoc[2] = { 16.0, 4.0 };
    for (int s = 0; s < 2; s++) {
        rec(&r, "ppl", s, "nodoc", "-", -1, -1);
        r.ppl = nodoc[s];
        evalres_push(&rs, &r);
        rec(&r, "ppl", s, "full", "-", -1, -1);
        r.ppl = full[s];
        evalres_push(&rs, &r);
        rec(&r, "ppl", s, "snapkv", "0.1", -1, -1);
        r.ppl = snap[s];
        evalres_push(&rs, &r);
    }
    char *buf = summary_of(&rs);
    const char *niah = strstr(buf, "niah, right answers:");
    cr_assert(niah, "%s", buf);
    cr_expect(strstr(niah, "| policy | 2048, 5% | 2048, 10% | 4096, 5% |\n"), "columns: only budgets that ran:\n%s", niah);
    cr_expect(strstr(niah, "| nodoc | 0/2 | 0/2 | 0/2 |\n"), "%s", niah);
    cr_expect(strstr(niah, "| full | 2/2 | 2/2 | 1/2 |\n"), "%s", niah);
    cr_expect(strstr(niah, "| chess (backtrack 0) | 1/2 | | 1/2 |\n"), "%s", niah);
    cr_expect(strstr(niah, "| chess (backtrack 1) | 2/2 | | 2/2 |\n"), "%s", niah);
    cr_expect(strstr(niah, "| snapkv | | 2/2 | 1/1 |\n"), "the refused run is not counted:\n%s", niah);
    cr_expect(strstr(niah, "| nodoc |") < strstr(niah, "| full |"), "the control comes first");
    const char *ppl = strstr(buf, "ppl, perplexity against the full cache");
    cr_assert(ppl, "%s", buf);
    cr_expect(strstr(ppl, "| policy | 2048, 10% |\n"), "%s", ppl);
    cr_expect(strstr(ppl, "| full | 5.00 |\n"), "%s", ppl);
    /* sqrt(9.5/8 x 8/2) = 2.179; sqrt(16/8 x 4/2) = 2 */
    cr_expect(strstr(ppl, "| snapkv | +117.9% |\n"), "%s", ppl);
    cr_expect(strstr(ppl, "| nodoc | +100.0% |\n"), "%s", ppl);
    free(buf);
    evalres_free(&rs);
}

/* eval without --budget runs each policy at its default: its rows have budget "-" like the full
 * cache's, and stand in a column of their own, not under every budget of a later run's. */
Test(eval_results, markdown_pivot_keeps_default_budget_runs_apart)
{
    static const struct { const char *policy, *budget; int correct; } runs[] = {
        { "full", "-", 1 }, { "snapkv", "-", 1 }, { "snapkv", "0.1", 0 }
    };
    eval_recs rs = { 0 };
    eval_rec r;
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        rec(&r, "niah", 0, runs[i].policy, runs[i].budget, runs[i].correct, 0);
        evalres_push(&rs, &r);
    }
    char *buf = summary_of(&rs);
    cr_expect(strstr(buf, "| policy | 2048, default budget | 2048, 10% |\n"), "%s", buf);
    cr_expect(strstr(buf, "| full | 1/1 | 1/1 |\n"), "%s", buf);
    cr_expect(strstr(buf, "| snapkv | 1/1 | 0/1 |\n"), "%s", buf);
    free(buf);
    evalres_free(&rs);
}

/* The points of the budget plots are means per (policy, budget); the full cache has no budget (NaN),
 * and its samples must still average into one point, not one each (the 20 samples of a pass-key
 * run drew the full cache as lines at 0% and 100%). */
Test(eval_results, plot_means_pool_the_runs_without_a_budget)
{
    plot_mean m[8];
    int n = 0;
    evalplot_mean_add(m, &n, 8, "full", NAN, 100);
    evalplot_mean_add(m, &n, 8, "full", NAN, 0);
    evalplot_mean_add(m, &n, 8, "full", NAN, 100);
    evalplot_mean_add(m, &n, 8, "chess", 0.1, 100);
    evalplot_mean_add(m, &n, 8, "chess", 0.1, 0);
    evalplot_mean_add(m, &n, 8, "chess", 0.2, 100);
    cr_assert_eq(n, 3, "%d entries: full's three runs must be one", n);
    cr_expect(!strcmp(m[0].name, "full") && isnan(m[0].x) && m[0].n == 3 && m[0].sum == 200);
    cr_expect(!strcmp(m[1].name, "chess") && m[1].x == 0.1 && m[1].n == 2 && m[1].sum == 100);
    cr_expect(m[2].x == 0.2 && m[2].n == 1);
}

/* Budgets on a log axis: the tics sit at the budgets run, labelled as written (gnuplot's own
 * would label only 0.1 between 0.05 and 0.2), and a panel that does not ask keeps gnuplot's. */
Test(eval_results, plot_tics_sit_at_the_budgets)
{
    plot_series s[2];
    int ns = 0;
    evalplot_add(s, &ns, 2, "chess", 0.2, 1);
    evalplot_add(s, &ns, 2, "chess", 0.05, 1);
    evalplot_add(s, &ns, 2, "take", 0.1, 1);
    evalplot_add(s, &ns, 2, "take", 0.05, 1);
    plot_panel p;
    memset(&p, 0, sizeof p);
    p.s = s;
    p.ns = ns;
    char buf[256];
    evalplot_xtics(&p, buf, sizeof buf);
    cr_expect_str_eq(buf, "set xtics autofreq");
    p.tics_at_points = 1;
    evalplot_xtics(&p, buf, sizeof buf);
    cr_expect_str_eq(buf, "set xtics (\"0.05\" 0.05, \"0.1\" 0.1, \"0.2\" 0.2)");
    p.ns = 0;
    evalplot_xtics(&p, buf, sizeof buf);
    cr_expect_str_eq(buf, "set xtics autofreq", "no points: gnuplot's own");
}

Test(eval_results, plot_is_a_png)
{
    char dir[] = "/tmp/kvchat-evalplot-XXXXXX", png[256], err[256];
    cr_assert(mkdtemp(dir));
    snprintf(png, sizeof png, "%s/p.png", dir);
    plot_series s[2];
    int ns = 0;
    evalplot_add(s, &ns, 2, "full", 4096, 50);
    evalplot_add(s, &ns, 2, "full", 2048, 60);
    evalplot_add(s, &ns, 2, "snap'kv", 2048, 30);
    cr_expect_eq(ns, 2);
    cr_expect(s[0].x[0] == 2048 && s[0].x[1] == 4096, "points kept in x order");
    plot_panel p = { .title = "title", .xlabel = "x", .ylabel = "y", .s = s, .ns = ns };
    cr_assert(evalplot_lines(png, &p, 1, 1, err, sizeof err) == 0, "%s", err);
    FILE *f = fopen(png, "rb");
    cr_assert(f, "no PNG written");
    unsigned char sig[8] = { 0 };
    cr_expect(fread(sig, 1, 8, f) == 8 && sig[1] == 'P' && sig[2] == 'N' && sig[3] == 'G');
    fclose(f);
    unlink(png);
    rmdir(dir);
}

/* ---- the command ----------------------------------------------------------------------------- */

static const char *bin(void)
{
    const char *b = getenv("KVCHAT_BIN");
    return b && *b ? b : "./kvchat";
}

static int run(const char *args, char *errb, size_t ecap)
{
    char cmd[2048], ep[] = "/tmp/kvchat-evalcli-XXXXXX";
    int fd = mkstemp(ep);
    cr_assert(fd >= 0);
    close(fd);
    snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>%s", bin(), args, ep);
    int st = system(cmd);
    FILE *f = fopen(ep, "r");
    size_t n = f ? fread(errb, 1, ecap - 1, f) : 0;
    errb[n] = 0;
    if (f) fclose(f);
    unlink(ep);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int count_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int n = 0, c;
    while ((c = fgetc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
}

Test(eval_cli, bad_input_is_one_line_and_status_1)
{
    char e[4096];
    const char *bad[] = { "eval --task nosuch", "eval --task niah --ctx 12", "eval --task niah --samples 1,2,3 --ctx 2K",
                          "eval --task niah --policy nosuch", "eval --task niah --filler bogus -m " TD
                          "tiny/tiny-llama-f16.gguf" };
    for (int i = 0; i < 5; i++) {
        int st = run(bad[i], e, sizeof e);
        cr_expect_eq(st, 1, "`%s` exited %d", bad[i], st);
        char *nl = strchr(e, '\n');
        cr_expect(nl && nl[1] == 0 && !strncmp(e, "kvchat: ", 8), "`%s` printed:\n%s", bad[i], e);
    }
}

Test(eval_cli, a_second_run_skips_the_rows_already_written, .timeout = 300)
{
    char dir[] = "/tmp/kvchat-evalrun-XXXXXX", args[1024], csv[300], e[4096];
    cr_assert(mkdtemp(dir));
    snprintf(args, sizeof args,
             "eval -m " TD "tiny/tiny-llama-f16.gguf -t 1 --task niah,ppl,multiturn --ctx 96 --samples 2 "
             "--filler generated --policy full,streaming,snapkv --budget 0.5 -n 4 --out %s",
             dir);
    int st = run(args, e, sizeof e);
    cr_assert_eq(st, 0, "first run failed:\n%s", e);
    snprintf(csv, sizeof csv, "%s/samples.csv", dir);
    int rows = count_lines(csv);
    /* per sample: niah 1 + 3 configurations, ppl 1 + 3, multiturn 3 x (1 + 3); a header line */
    cr_expect_eq(rows, 1 + 2 * (4 + 4 + 12), "%d lines in %s", rows, csv);
    st = run(args, e, sizeof e);
    cr_assert_eq(st, 0, "second run failed:\n%s", e);
    cr_expect(strstr(e, "rows already"), "the second run did not see the first one's rows:\n%s", e);
    cr_expect_eq(count_lines(csv), rows, "the second run wrote rows again");
    char p[400];
    snprintf(p, sizeof p, "%s/summary.md", dir);
    struct stat sb;
    cr_expect(stat(p, &sb) == 0 && sb.st_size > 100, "no summary.md");
    const char *pngs[] = { "accuracy_vs_budget.png", "ppl_vs_budget.png", "niah_heatmap_0.5.png", "speed_memory.png" };
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, pngs[i]);
        cr_expect(stat(p, &sb) == 0 && sb.st_size > 1000, "%s missing", pngs[i]);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s/summary.md", dir);
    unlink(p);
    unlink(csv);
    rmdir(dir);
}
