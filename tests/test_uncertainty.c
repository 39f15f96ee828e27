/* test_uncertainty.c - the uncertainty monitor and backtracking: page statistics and quantiles of
 * known samples, the thresholds file, and on the tiny models: with triggers off (or thresholds
 * never crossed) the answer is the plain decoding's, and a forced trigger (thresholds 0) rolls back
 * and regenerates exactly one page per allowed regeneration and logs it. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "engine/forward.h"
#include "engine/generate.h"
#include "engine/model.h"
#include "engine/policy/policy.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"
#include "engine/uncertainty.h"
#include "tests/fwd_fixture.h"

#define TD "../shared/testdata/"

Test(uncertainty, page_statistics_of_a_known_sample)
{
    float h[4] = { 1, 2, 3, 4 };
    unc_stats s;
    unc_stats_of(h, 4, &s);
    cr_expect(fabs(s.mean_h - 2.5) < 1e-12 && fabs(s.var_h - 1.25) < 1e-12, "mean %g var %g", s.mean_h, s.var_h);
    unc_stats_of(h, 0, &s);
    cr_expect(s.n == 0 && s.mean_h == 0 && s.var_h == 0);

    unc_monitor *m = unc_create(2, 3);
    for (int i = 0; i < 4; i++) cr_assert(unc_push(m, h[i], 0) == 0);
    unc_range(m, 2, 2, &s);
    cr_expect(fabs(s.mean_h - 3.5) < 1e-12 && fabs(s.var_h - 0.25) < 1e-12);
    unc_window(m, &s);   /* the last 3 tokens: 2, 3, 4 */
    cr_expect(s.n == 3 && fabs(s.mean_h - 3) < 1e-12 && fabs(s.var_h - 2.0 / 3.0) < 1e-12);
    unc_drop(m, 2);
    cr_expect_eq(unc_count(m), 2);
    unc_free(m);
}

Test(uncertainty, quantiles_of_a_known_sample)
{
    double v[101];
    for (int i = 0; i < 101; i++) v[i] = 100 - i;   /* 100 .. 0, unsorted on purpose */
    cr_expect(fabs(unc_quantile(v, 101, 0.99) - 99) < 1e-12, "q99 of 0..100 is 99");
    cr_expect(fabs(unc_quantile(v, 101, 0.5) - 50) < 1e-12);
    double w[2] = { 10, 0 };
    cr_expect(fabs(unc_quantile(w, 2, 0.25) - 2.5) < 1e-12, "interpolates between order statistics");
    double one = 7;
    cr_expect(unc_quantile(&one, 1, 0.99) == 7);
}

Test(uncertainty, crossing_means_both_statistics_above_their_thresholds)
{
    unc_thresholds t = { 0 };
    unc_stats s = { 1.0, 0.5, 32 };
    cr_expect(!unc_crosses(&t, &s), "no thresholds: never");
    t.valid = 1;
    t.h_mean = 1.0;
    t.h_var = 0.5;
    cr_expect(!unc_crosses(&t, &s), "equal is not above");
    s.mean_h = 1.01;
    cr_expect(!unc_crosses(&t, &s), "a high mean entropy alone is not Fig. 4's region");
    s.mean_h = 0.2;
    s.var_h = 0.6;
    cr_expect(!unc_crosses(&t, &s), "a high variance alone is not Fig. 4's region");
    s.mean_h = 1.01;
    cr_expect(unc_crosses(&t, &s), "both above");
}

Test(uncertainty, thresholds_file_round_trip_and_bad_files)
{
    char path[] = "/tmp/kvchat-thr-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    unc_thresholds t = { 0 }, u;
    t.valid = 1;
    t.h_mean = 1.2345;
    t.h_var = 0.678;
    t.page = 32;
    t.quantile = 0.99;
    t.samples = 1500;
    t.seed = 7;
    snprintf(t.model, sizeof t.model, "m.gguf");
    snprintf(t.fingerprint, sizeof t.fingerprint, "0123456789abcdef");
    t.n_heads = 3;
    t.head_sim[0] = (unc_head_sim){ 5, 0, 0.75f };
    t.head_sim[1] = (unc_head_sim){ 11, 0, 0.5f };
    t.head_sim[2] = (unc_head_sim){ 17, 1, 0.25f };
    char err[256];
    cr_assert(unc_thresholds_save(path, &t, err, sizeof err) == 0, "%s", err);
    cr_assert(unc_thresholds_load(path, &u, err, sizeof err) == 0, "%s", err);
    cr_expect(u.valid && fabs(u.h_mean - 1.2345) < 1e-9 && fabs(u.h_var - 0.678) < 1e-9 && u.page == 32 &&
              u.samples == 1500 && u.seed == 7 && !strcmp(u.fingerprint, t.fingerprint));
    cr_expect(u.n_heads == 3 && u.head_sim[1].layer == 11 && u.head_sim[2].head == 1 && u.head_sim[2].sim == 0.25f,
              "per-head similarity survives the round trip");
    FILE *f = fopen(path, "w");
    fputs("entropy_mean=1\n", f);
    fclose(f);
    cr_expect(unc_thresholds_load(path, &u, err, sizeof err) != 0 && strstr(err, "missing"), "%s", err);
    f = fopen(path, "w");
    fputs("entropy_mean=-1\nentropy_var=2\n", f);
    fclose(f);
    cr_expect(unc_thresholds_load(path, &u, err, sizeof err) != 0 && strstr(err, "non-negative"), "%s", err);
    f = fopen(path, "w");
    fputs("entropy_mean=1\nentropy_var=2\nhead_similarity=1:0:0.5 2:x\n", f);
    fclose(f);
    cr_expect(unc_thresholds_load(path, &u, err, sizeof err) != 0 && strstr(err, "LAYER:HEAD"), "%s", err);
    f = fopen(path, "w");
    fputs("garbage\n", f);
    fclose(f);
    cr_expect(unc_thresholds_load(path, &u, err, sizeof err) != 0 && strstr(err, "key=value"), "%s", err);
    unlink(path);
    cr_expect(unc_thresholds_load(path, &u, err, sizeof err) != 0 && strstr(err, "No such file"), "%s", err);
}

/* ---------------------------------------------------------------- the answer loop on a tiny model */

/* Prefill the prompt and answer n tokens with pages of P tokens; thr NULL: plain decoding by hand
 * (sample, decode), the reference. */
static void answer(const char *file, const char *spec, const unc_thresholds *thr, int R, int P, int n, fx_answer *out)
{
    char err[512];
    model *m;
    cr_assert(model_load(&m, file, NULL, err, sizeof err) == 0, "%s", err);
    be_backend *b = be_cpu_create(2, err, sizeof err);
    fwd_opts fo = { 2048, 64, P };
    fwd_ctx *f = fwd_create(m, b, &fo, err, sizeof err);
    cr_assert(f, "%s", err);
    pol_set *ps = fwd_fixture_policy(f, spec);
    FILE *pf = fopen(TD "prompts/p2.txt", "rb");
    cr_assert(pf);
    char buf[65536];
    size_t len = fread(buf, 1, sizeof buf - 1, pf);
    fclose(pf);
    int32_t *ids = NULL;
    size_t n_ids;
    cr_assert(tok_encode(m->vocab, buf, len, tok_add_bos(m->vocab), 0, &ids, &n_ids, err, sizeof err) == 0);
    int32_t nv = m->hp.n_vocab;
    float *logits = malloc(sizeof(float) * (size_t)nv);
    samp_params sp = samp_params_default();
    sp.temperature = 0;
    samp *s = samp_create(&sp, nv);
    cr_assert(fwd_eval(f, ids, (int64_t)n_ids, logits, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    memset(out, 0, sizeof *out);
    fwd_set_floor(f, (int64_t)n_ids - 1);   /* as chat and eval do */
    if (!thr) {
        for (int i = 0; i < n; i++) {
            int32_t id = samp_sample(s, logits);
            if (tok_is_eog(m->vocab, id)) break;
            samp_accept(s, id);
            out->tok[out->n++] = id;
            if (i + 1 < n) cr_assert(fwd_decode(f, id, logits, NULL, err, sizeof err) == 0, "%s", err);
        }
    } else {
        unc_monitor *mon = unc_create(P, 0);
        gen_opts go = { n, ids[n_ids - 1], thr, R, 0, 0, NULL, 0 };
        gen_callbacks cb = fwd_fixture_recorder(out);
        gen_ctx gc = { f, s, m->vocab, mon, logits, nv, NULL };
        cr_assert(gen_answer(&gc, &go, &cb, &out->res, err, sizeof err) == 0, "%s", err);
        cr_expect_eq(out->res.n_gen, out->n, "every final token was handed out once");
        if (out->res.stop == GEN_STOP_LIMIT)
            cr_expect_eq(fwd_pos(f), (int64_t)n_ids + out->n - 1, "the cache holds the prompt and the answer");
        /* backtracking protects its own rewind targets and leaves the caller's floor working */
        cr_expect_eq(fwd_rewind(f, (int64_t)n_ids - 1), (int64_t)n_ids - 1, "the caller's floor was lost");
        unc_free(mon);
    }
    free(logits);
    samp_free(s);
    free(ids);
    fwd_free(f);
    pol_set_free(ps);
    be_free(b);
    model_free(m);
}

Test(uncertainty, without_triggers_the_answer_is_plain_decoding, .timeout = 120)
{
    const char *files[2] = { TD "tiny/tiny-llama-f16.gguf", TD "tiny/tiny-gemma3-f16.gguf" };
    for (int i = 0; i < 2; i++) {
        fx_answer plain, off, high;
        answer(files[i], "chess:rebuild=event", NULL, 0, 8, 40, &plain);
        cr_assert(plain.n >= 16, "the tiny model answered only %d tokens", plain.n);
        unc_thresholds none = { 0 };
        answer(files[i], "chess:rebuild=event", &none, 2, 8, 40, &off);
        unc_thresholds never = { .valid = 1, .h_mean = 1e9, .h_var = 1e9 };
        answer(files[i], "chess:rebuild=event", &never, 2, 8, 40, &high);
        cr_expect(off.n == plain.n && !memcmp(off.tok, plain.tok, sizeof(int32_t) * (size_t)plain.n),
                  "%s: triggers off changed the answer", files[i]);
        cr_expect(high.n == plain.n && !memcmp(high.tok, plain.tok, sizeof(int32_t) * (size_t)plain.n),
                  "%s: thresholds never crossed changed the answer", files[i]);
        cr_expect(off.res.events == 0 && high.res.events == 0 && high.res.regenerated == 0);
    }
}

Test(uncertainty, forced_trigger_regenerates_exactly_one_page_and_logs_it, .timeout = 120)
{
    const char *files[2] = { TD "tiny/tiny-llama-f16.gguf", TD "tiny/tiny-gemma3-f16.gguf" };
    const int P = 8, n = 48;   /* longer than the tiny Gemma's 32-token window plus a page */
    for (int i = 0; i < 2; i++) {
        fx_answer plain, forced;
        answer(files[i], "full", NULL, 0, P, n, &plain);
        cr_assert(plain.n == n, "the tiny model stopped after %d tokens", plain.n);
        unc_thresholds zero = { .valid = 1, .h_mean = 0, .h_var = 0 };
        /* full attention has no selection to rebuild: the regenerated page must repeat the first
         * attempt token for token, which shows the rollback (cache, sampler, monitor) is exact,
         * also across the sliding-window layers of the Gemma model */
        answer(files[i], "full", &zero, 1, P, n, &forced);
        cr_expect_eq(forced.res.regenerated, 1, "%s: one regeneration allowed", files[i]);
        cr_expect_eq(forced.res.events, n / P, "%s: every page crosses thresholds of 0", files[i]);
        cr_expect_eq(forced.res.n_decoded, (int64_t)(n - 1 + P), "%s: one page (P steps) decoded again", files[i]);
        cr_expect(forced.n == plain.n && !memcmp(forced.tok, plain.tok, sizeof(int32_t) * (size_t)n),
                  "%s: the answer differs from plain decoding", files[i]);
        cr_assert(forced.n_ev == n / P);
        const unc_event *e = &forced.ev[0];
        cr_expect(e->regenerated && e->page == 0 && e->step == P - 1 && e->stats.n == P && e->thr_h == 0 &&
                  !e->changed_text && e->after.n == P && !e->recovered,
                  "%s: the first event is the regenerated page 0", files[i]);
        for (int k = 1; k < forced.n_ev; k++)
            cr_expect(!forced.ev[k].regenerated && forced.ev[k].page == k, "%s: later events are logged only",
                      files[i]);
        cr_expect(fabs(e->after.mean_h - e->stats.mean_h) < 1e-6, "same tokens, same statistics");
        /* every page regenerated once: the later rollbacks land inside the answer, where the
         * sliding-window layers must still hold what the page start needs */
        fx_answer all;
        answer(files[i], "full", &zero, n / P, P, n, &all);
        cr_expect_eq(all.res.regenerated, n / P);
        cr_expect_eq(all.res.n_decoded, (int64_t)(n - 1 + n), "%s: every page decoded twice", files[i]);
        cr_expect(all.n == plain.n && !memcmp(all.tok, plain.tok, sizeof(int32_t) * (size_t)n),
                  "%s: regenerating every page changed the answer", files[i]);
    }
}

Test(uncertainty, an_answer_shorter_than_a_page_is_checked_and_regenerated, .timeout = 120)
{
    /* a 6-token answer with pages of 8 never completes a page: its last partial page is checked
     * when the answer ends (at least GEN_MIN_CHECKED = 4 tokens), as a page would be */
    const char *files[2] = { TD "tiny/tiny-llama-f16.gguf", TD "tiny/tiny-gemma3-f16.gguf" };
    const int P = 8, n = 6;
    for (int i = 0; i < 2; i++) {
        fx_answer plain, forced, tiny;
        answer(files[i], "full", NULL, 0, P, n, &plain);
        cr_assert(plain.n == n, "the tiny model stopped after %d tokens", plain.n);
        unc_thresholds zero = { .valid = 1, .h_mean = 0, .h_var = 0 };
        answer(files[i], "full", &zero, 1, P, n, &forced);
        cr_expect_eq(forced.res.events, 1, "%s: the partial page crossed thresholds of 0", files[i]);
        cr_expect_eq(forced.res.regenerated, 1, "%s", files[i]);
        cr_expect_eq(forced.res.n_decoded, (int64_t)(n - 1 + n), "%s: the partial page (n steps) decoded again",
                     files[i]);
        cr_expect_eq(forced.res.stop, GEN_STOP_LIMIT, "%s", files[i]);
        cr_expect(forced.n == plain.n && !memcmp(forced.tok, plain.tok, sizeof(int32_t) * (size_t)n),
                  "%s: full attention regenerated other tokens", files[i]);
        cr_assert(forced.n_ev == 1);
        const unc_event *e = &forced.ev[0];
        cr_expect(e->regenerated && e->page == 0 && e->step == n - 1 && e->stats.n == n && e->after.n == n &&
                      !e->changed_text,
                  "%s: the event is the regenerated partial page 0", files[i]);
        /* 3 tokens are too few to judge: no check, plain decoding */
        answer(files[i], "full", &zero, 1, P, 3, &tiny);
        cr_expect(tiny.res.events == 0 && tiny.res.regenerated == 0 && tiny.n == 3, "%s", files[i]);
    }
}

Test(uncertainty, chess_reselection_reports_the_pages_it_changed, .timeout = 120)
{
    /* the anchor moves with the generated keys, so a reselection at a page end may pick other pages;
     * whatever it picks, the event's lists must match the selection before and after */
    fx_answer forced;
    unc_thresholds zero = { .valid = 1, .h_mean = 0, .h_var = 0 };
    answer(TD "tiny/tiny-llama-f16.gguf", "chess:rebuild=event,budget=64,sink=1,window=1", &zero, 2, 8, 32, &forced);
    cr_expect_eq(forced.res.regenerated, 2);
    cr_assert(forced.n_ev >= 2);
    for (int k = 0; k < 2; k++) {
        const unc_event *e = &forced.ev[k];
        cr_expect(e->regenerated);
        for (int a = 0; a < e->n_added && a < UNC_EVENT_PAGES; a++)
            for (int r = 0; r < e->n_removed && r < UNC_EVENT_PAGES; r++)
                cr_expect(e->added[a] != e->removed[r], "page %d both added and removed", e->added[a]);
    }
}
