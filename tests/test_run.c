/* test_run.c - the runtime of one sequence on the tiny models: the sequence's ids stay beside the
 * cache through feeds, decodes, rewinds and answers; a side answer leaves no trace; swapping
 * policies and back restores the set and the figures follow the set attached; a snapshot restored
 * into a sibling continues with the same logits; the figures agree with the cache; position states
 * say what an evicting policy dropped and what a selection attended; a warm-up at load leaves no
 * trace. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/run.h"
#include "engine/tokenizer.h"

#define TD "../shared/testdata/"
#define GEMMA TD "tiny/tiny-gemma3-q4_k_m.gguf"
#define LLAMA TD "tiny/tiny-llama-f16.gguf"

static run *open_run_warm(const char *path, const char *spec, int warm_up, int n_batch);

static run *open_run(const char *path, const char *spec) { return open_run_warm(path, spec, 0, 0); }

/* warm_up as run_config's (0: none on the CPU), n_batch the prefill chunk (0: 512) */
static run_config test_config(const char *path, int warm_up, int n_batch)
{
    run_config c;
    memset(&c, 0, sizeof c);
    c.model_path = path;
    c.device = BE_DEVICE_CPU;
    c.n_threads = 2;
    c.n_ctx = 2048;
    c.page_size = 8;
    c.sp = samp_params_default();
    c.sp.temperature = 0;
    c.warm_up = warm_up;
    c.n_batch = n_batch;
    return c;
}

static run *open_run_warm(const char *path, const char *spec, int warm_up, int n_batch)
{
    run_config c = test_config(path, warm_up, n_batch);
    char err[600];
    if (spec) cr_assert(pol_parse(&c.policy, spec, NULL, err, sizeof err) == 0, "%s", err);
    run *r = run_create(&c, err, sizeof err);
    cr_assert(r, "%s", err);
    return r;
}

/* n pseudo-random ids of the vocabulary's ordinary range, the first BOS when the model has one */
static int32_t *some_ids(const run *r, int64_t n)
{
    const model *m = run_model(r);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    cr_assert(ids);
    uint64_t x = 12345;
    for (int64_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)(10 + (x >> 33) % (uint64_t)(m->hp.n_vocab - 20));
    }
    if (tok_bos(m->vocab) >= 0) ids[0] = tok_bos(m->vocab);
    return ids;
}

static float *copy_logits(const run *r)
{
    size_t n = (size_t)run_model(r)->hp.n_vocab;
    float *l = malloc(sizeof(float) * n);
    cr_assert(l);
    memcpy(l, run_logits(r), sizeof(float) * n);
    return l;
}

static int same_logits(const run *r, const float *l)
{
    return !memcmp(run_logits(r), l, sizeof(float) * (size_t)run_model(r)->hp.n_vocab);
}

Test(run, waiting_ids_are_evaluated_by_the_next_feed)
{
    run *r = open_run(GEMMA, NULL);
    int32_t *ids = some_ids(r, 100);
    char err[600];
    cr_assert(run_feed(r, ids, 60, NULL, NULL, err, sizeof err) == RUN_OK, "%s", err);
    cr_assert(run_append(r, ids + 60, 10, err, sizeof err) == RUN_OK);
    int64_t n;
    run_tokens(r, &n);
    cr_expect_eq(run_pos(r), 60, "appended ids wait");
    cr_expect_eq(n, 70);
    cr_assert(run_feed(r, ids + 70, 30, NULL, NULL, err, sizeof err) == RUN_OK, "%s", err);
    cr_expect_eq(run_pos(r), 100, "the waiting ids and the new ones are in the cache");
    float *a = copy_logits(r);
    /* the same 100 ids in one feed give the same logits */
    run *q = open_run(GEMMA, NULL);
    cr_assert(run_feed(q, ids, 100, NULL, NULL, err, sizeof err) == RUN_OK, "%s", err);
    cr_expect(same_logits(q, a), "feeding in three parts equals one feed");
    free(a);
    free(ids);
    run_free(q);
    run_free(r);
}

Test(run, rewind_keeps_what_it_is_asked_to_and_decode_equals_feed)
{
    run *r = open_run(GEMMA, NULL);
    int32_t *ids = some_ids(r, 80);
    char err[600];
    cr_assert(run_feed(r, ids, 80, NULL, NULL, err, sizeof err) == RUN_OK, "%s", err);
    float *at80 = copy_logits(r);
    /* back to 40, keeping ids 40..49 waiting: the next feed evaluates them first */
    cr_assert(run_rewind(r, 40, 50, err, sizeof err) == RUN_OK, "%s", err);
    int64_t n;
    const int32_t *seq = run_tokens(r, &n);
    cr_expect_eq(run_pos(r), 40);
    cr_expect_eq(n, 50);
    cr_expect_eq(seq[49], ids[49]);
    cr_assert(run_feed(r, ids + 50, 30, NULL, NULL, err, sizeof err) == RUN_OK, "%s", err);
    cr_expect(same_logits(r, at80), "the sequence evaluated again ends with the same logits");
    /* decoding the last token alone gives the logits of feeding it */
    cr_assert(run_rewind(r, 79, 79, err, sizeof err) == RUN_OK, "%s", err);
    cr_assert(run_decode(r, ids[79], err, sizeof err) == RUN_OK, "%s", err);
    cr_expect(same_logits(r, at80), "a decode step equals the prefill of the same token");
    /* with a waiting id a decode step is refused, not silently misplaced */
    cr_assert(run_append(r, ids, 1, err, sizeof err) == RUN_OK);
    cr_expect(run_decode(r, ids[1], err, sizeof err) == RUN_EFAIL);
    cr_expect(strstr(err, "wait"), "%s", err);
    cr_expect(run_rewind(r, 10, 5, err, sizeof err) == RUN_EFAIL, "fewer ids than the cache holds is refused");
    free(at80);
    free(ids);
    run_free(r);
}

typedef struct tokens {
    int32_t v[64];
    int n;
} tokens;

static void keep_token(void *ud, int32_t id)
{
    tokens *t = ud;
    if (t->n < 64) t->v[t->n++] = id;
}

Test(run, a_side_answer_leaves_no_trace_and_a_kept_one_joins_the_sequence)
{
    run *r = open_run(GEMMA, NULL);
    int32_t *ids = some_ids(r, 64);
    char err[600];
    cr_assert(run_feed(r, ids, 64, NULL, NULL, err, sizeof err) == RUN_OK, "%s", err);
    run_set_floor(r, 64);
    float *l0 = copy_logits(r);
    void *s0 = malloc(run_sampler_state_size(r));
    run_save_sampler(r, s0);
    run_answer_opts side = { 12, 0, 0, 0, 0, NULL, 0 };
    tokens a = { .n = 0 }, b = { .n = 0 };
    gen_callbacks ca = { &a, keep_token, NULL, NULL }, cb = { &b, keep_token, NULL, NULL };
    gen_result g;
    cr_assert(run_answer(r, &side, &ca, &g, err, sizeof err) == RUN_OK, "%s", err);
    int64_t n;
    run_tokens(r, &n);
    cr_expect_eq(run_pos(r), 64, "the cache went back");
    cr_expect_eq(n, 64, "the sequence has no answer tokens");
    cr_expect(a.n > 0);
    /* the same start gives the same answer */
    run_set_logits(r, l0);
    run_load_sampler(r, s0);
    cr_assert(run_answer(r, &side, &cb, &g, err, sizeof err) == RUN_OK, "%s", err);
    cr_expect_eq(a.n, b.n);
    cr_expect(!memcmp(a.v, b.v, sizeof(int32_t) * (size_t)a.n), "a side answer twice is the same answer");
    /* kept: the answer's tokens join the sequence, the last one waiting */
    run_set_logits(r, l0);
    run_load_sampler(r, s0);
    run_answer_opts keep = { 12, 1, 0, 0, 0, NULL, 0 };
    tokens c = { .n = 0 };
    gen_callbacks cc = { &c, keep_token, NULL, NULL };
    cr_assert(run_answer(r, &keep, &cc, &g, err, sizeof err) == RUN_OK, "%s", err);
    const int32_t *seq = run_tokens(r, &n);
    cr_expect_eq(n, 64 + c.n);
    cr_expect_eq(run_pos(r), n - 1, "the last sampled token waits for the next feed");
    cr_expect(!memcmp(seq + 64, a.v, sizeof(int32_t) * (size_t)c.n), "the kept answer is the side answer");
    run_figures fg;
    run_get_figures(r, &fg);
    cr_expect_eq(fg.decoded, g.n_decoded, "the figures count the answer's decode steps");
    free(s0);
    free(l0);
    free(ids);
    run_free(r);
}

Test(run, swapping_policies_and_back_restores_the_set_and_the_figures_follow_it)
{
    run *r = open_run(LLAMA, "full");
    int32_t *ids = some_ids(r, 200);
    char err[600];
    cr_assert(run_feed(r, ids, 200, NULL, NULL, err, sizeof err) == RUN_OK, "%s", err);
    const pol_set *orig = run_policies(r);
    pol_spec q;
    cr_assert(pol_parse(&q, "quest:budget=64", NULL, err, sizeof err) == 0, "%s", err);
    pol_set *ps = run_new_policies(r, &q, err, sizeof err);
    cr_assert(ps, "%s", err);
    pol_set *back = run_swap_policies(r, ps);
    cr_expect_eq(back, orig, "the swap hands back the set it replaced");
    int32_t nv = run_model(r)->hp.n_vocab;
    for (int i = 0; i < 4; i++) cr_assert(run_decode(r, samp_argmax(run_logits(r), nv), err, sizeof err) == RUN_OK);
    run_figures fg;
    run_get_figures(r, &fg);
    cr_expect_eq(fg.steps, 4);
    cr_expect(fg.pages_per_step < fg.pages_avail_per_step, "quest reads fewer pages than there are: %.1f of %.1f",
              fg.pages_per_step, fg.pages_avail_per_step);
    cr_expect(fg.kv_read_per_step > 0);
    pol_set_free(run_swap_policies(r, back));
    cr_expect_eq(run_policies(r), orig, "swapped back");
    run_get_figures(r, &fg);
    cr_expect_eq(fg.steps, 0, "the original set decoded nothing");
    /* budgets are checked against the sequence */
    pol_spec big;
    cr_assert(pol_parse(&big, "quest:budget=5000", NULL, err, sizeof err) == 0, "%s", err);
    cr_expect(run_check_policy(r, &big, 204, err, sizeof err) == RUN_EFAIL, "a budget above the sequence is refused");
    free(ids);
    run_free(r);
}

Test(run, a_snapshot_restored_into_a_sibling_continues_with_the_same_logits)
{
    run *r = open_run(GEMMA, "snapkv:budget=48");
    int32_t *ids = some_ids(r, 160);
    char err[600];
    cr_assert(run_feed(r, ids, 160, NULL, NULL, err, sizeof err) == RUN_OK, "%s", err);
    void *data;
    size_t len;
    static const char sha[] = "0123456789012345678901234567890123456789012345678901234567890123";
    cr_assert(run_snapshot(r, sha, &data, &len, err, sizeof err) == RUN_OK, "%s", err);
    run *s = run_sibling(r, err, sizeof err);
    cr_assert(s, "%s", err);
    cr_expect(run_check_snapshot(s, data, len, sha, err, sizeof err) == RUN_OK, "%s", err);
    cr_expect(run_check_snapshot(s, data, len, "f0f0", err, sizeof err) == RUN_EFAIL, "another model's is refused");
    cr_assert(run_restore(s, data, len, sha, err, sizeof err) == RUN_OK, "%s", err);
    int64_t na, nb;
    run_tokens(r, &na);
    run_tokens(s, &nb);
    cr_expect_eq(na, nb);
    cr_expect_eq(run_pos(s), run_pos(r));
    cr_assert(run_decode(r, 77, err, sizeof err) == RUN_OK, "%s", err);
    cr_assert(run_decode(s, 77, err, sizeof err) == RUN_OK, "%s", err);
    cr_expect(!memcmp(run_logits(r), run_logits(s), sizeof(float) * (size_t)run_model(r)->hp.n_vocab),
              "the restored sibling decodes exactly as the original");
    free(data);
    free(ids);
    run_free(s);
    run_free(r);
}

Test(run, figures_and_position_states_say_what_is_held_and_attended)
{
    char err[600];
    /* full: every position held, the figures those of the cache */
    run *r = open_run(GEMMA, NULL);
    int32_t *ids = some_ids(r, 240);
    cr_assert(run_feed(r, ids, 240, NULL, NULL, err, sizeof err) == RUN_OK, "%s", err);
    run_figures fg;
    run_get_figures(r, &fg);
    cr_expect_eq(fg.positions, 240);
    cr_expect_eq(fg.page_size, 8);
    cr_expect_eq(fg.prefill_tokens, 240);
    cr_expect(fg.prefill_tok_s > 0);
    cr_expect(fg.kv_held > 0 && fg.kv_held <= fg.kv_peak, "held %llu, peak %llu", (unsigned long long)fg.kv_held,
              (unsigned long long)fg.kv_peak);
    cr_expect(!fg.saves_memory);
    uint8_t st[240];
    run_position_states(r, st, 240);
    int held = 0;
    for (int i = 0; i < 240; i++) held += st[i] == 1;
    cr_expect_eq(held, 240, "the full cache holds every position");
    run_free(r);
    /* snapkv at 48 tokens: most positions dropped, the memory figures below the full cache's */
    r = open_run(GEMMA, "snapkv:budget=48");
    cr_assert(run_feed(r, ids, 240, NULL, NULL, err, sizeof err) == RUN_OK, "%s", err);
    run_get_figures(r, &fg);
    cr_expect(fg.saves_memory);
    cr_expect(fg.tokens_kept < fg.tokens_full, "kept %lld of %lld", (long long)fg.tokens_kept, (long long)fg.tokens_full);
    run_position_states(r, st, 240);
    int dropped = 0;
    held = 0;
    for (int i = 0; i < 240; i++) {
        dropped += st[i] == 0;
        held += st[i] == 1;
    }
    cr_expect(dropped > 0 && held > 0 && held <= 48, "%d held, %d dropped", held, dropped);
    run_free(r);
    /* quest: after a decode step some held positions were attended and others were not */
    r = open_run(GEMMA, "quest:budget=32");
    cr_assert(run_feed(r, ids, 240, NULL, NULL, err, sizeof err) == RUN_OK, "%s", err);
    cr_assert(run_decode(r, 5, err, sizeof err) == RUN_OK, "%s", err);
    uint8_t st2[241];
    run_position_states(r, st2, 241);
    int att = 0;
    held = 0;
    for (int i = 0; i < 241; i++) {
        att += st2[i] == 2;
        held += st2[i] == 1;
    }
    cr_expect(att > 0 && held > 0, "%d attended, %d held only", att, held);
    /* every global KV head has a key similarity once the cache holds keys */
    double sim[64];
    int layers[16];
    int n = run_head_similarity(r, sim, layers, 64);
    cr_expect(n > 0);
    for (int i = 0; i < n; i++) cr_expect(!isnan(sim[i]) && sim[i] <= 1.0 + 1e-9, "head %d: %f", i, sim[i]);
    free(ids);
    run_free(r);
}

/* A warm-up at load (run_config.warm_up: by default on a device only) runs a throwaway prompt, a
 * question and a decode step in a cache of its own, before the run's: the run then gives the same
 * bits, cache and figures as one loaded without it, under a selection and an evicting policy, with
 * the default chunk and a small one. */
Test(run, a_warm_up_at_load_leaves_no_trace)
{
    const char *paths[] = { GEMMA, LLAMA };
    const char *specs[] = { "quest", "snapkv" };
    char err[600];
    for (int mi = 0; mi < 2; mi++) {
        int n_batch = mi ? 24 : 0;
        run *cold = open_run_warm(paths[mi], specs[mi], 0, n_batch), *warm = open_run_warm(paths[mi], specs[mi], 1, n_batch);
        run *never = open_run_warm(paths[mi], specs[mi], -1, n_batch);
        run_figures fc, fw, fn;
        run_get_figures(cold, &fc);
        run_get_figures(warm, &fw);
        run_get_figures(never, &fn);
        cr_expect_eq(fc.warm_up_s, 0, "the CPU warmed up without being asked");
        cr_expect_eq(fn.warm_up_s, 0);
        cr_expect_gt(fw.warm_up_s, 0, "no warm-up ran");
        cr_expect_eq(fw.positions, 0, "the warm-up's tokens are in the run's cache");
        int32_t *ids = some_ids(cold, 100);
        cr_assert(run_feed(cold, ids, 100, NULL, NULL, err, sizeof err) == RUN_OK, "%s", err);
        cr_assert(run_feed(warm, ids, 100, NULL, NULL, err, sizeof err) == RUN_OK, "%s", err);
        float *l = copy_logits(cold);
        cr_expect(same_logits(warm, l), "%s: the prefill's logits differ after a warm-up", paths[mi]);
        free(l);
        for (int t = 0; t < 6; t++) {
            int32_t next = samp_argmax(run_logits(cold), run_model(cold)->hp.n_vocab);
            cr_assert(run_decode(cold, next, err, sizeof err) == RUN_OK, "%s", err);
            cr_assert(run_decode(warm, next, err, sizeof err) == RUN_OK, "%s", err);
            l = copy_logits(cold);
            cr_expect(same_logits(warm, l), "%s: decode step %d differs after a warm-up", paths[mi], t);
            free(l);
        }
        run_get_figures(cold, &fc);
        run_get_figures(warm, &fw);
        cr_expect_eq(fw.positions, fc.positions);
        cr_expect_eq(fw.tokens_kept, fc.tokens_kept);
        cr_expect_eq(fw.kv_peak, fc.kv_peak, "the warm-up's cache counted in the run's peak");
        cr_expect_eq(fw.steps, fc.steps);
        cr_expect_eq(fw.pages_per_step, fc.pages_per_step);
        free(ids);
        run_free(never);
        run_free(warm);
        run_free(cold);
    }
}

/* ---- answers of forks in one batch (run_fork, run_answer_batch) */

/* An answer's tokens and its own stop flag, raised once it has `at` tokens (0: never), as eval
 * stops an answer at its line's end. */
typedef struct stopper {
    tokens t;
    volatile sig_atomic_t flag;
    int at;
} stopper;

static void stop_token(void *ud, int32_t id)
{
    stopper *p = ud;
    keep_token(&p->t, id);
    if (p->at && p->t.n >= p->at) p->flag = 1;
}

/* A run whose sampling draws (seeded) and whose thresholds make pages cross (so answers go back and
 * generate pages again), fed a prompt. */
static run *sampling_run(const char *path, int64_t n_prompt)
{
    run_config c = test_config(path, 0, 0);
    c.sp.temperature = 1.2f;
    c.sp.seed = 7;
    c.thr.valid = 1;
    c.thr.page = 8;
    c.thr.h_mean = 0.05;
    c.thr.h_var = 1e-7;   /* the random models are near uniform: their entropy hardly varies */
    char err[600];
    run *r = run_create(&c, err, sizeof err);
    cr_assert(r, "%s", err);
    int32_t *ids = some_ids(r, n_prompt);
    cr_assert(run_feed(r, ids, n_prompt, NULL, NULL, err, sizeof err) == RUN_OK, "%s", err);
    free(ids);
    return r;
}

static void batch_equals_alone(const char *path, const char *const *specs, int n)
{
    char err[600];
    run *r = sampling_run(path, 90);
    int64_t pos0 = run_pos(r);
    float *l0 = copy_logits(r);
    const char *stops[] = { "zq" };   /* a stop the random models may write */
    run_answer_opts o[FWD_BATCH_MAX];
    stopper alone[FWD_BATCH_MAX], both[FWD_BATCH_MAX];
    gen_result ra[FWD_BATCH_MAX], rb[FWD_BATCH_MAX];
    int events = 0, regen = 0, lens = 0, stopped = 0;
    int64_t end[FWD_BATCH_MAX];
    for (int s = 0; s < n; s++) {
        pol_spec ps;
        cr_assert(pol_parse(&ps, specs[s], NULL, err, sizeof err) == 0, "%s", err);
        run *f = run_fork(r, &ps, err, sizeof err);
        cr_assert(f, "%s", err);
        /* the answers end at steps of their own */
        o[s] = (run_answer_opts){ 24 + 4 * s, 1, 2, 1, 1, stops, 1 };   /* kept, as eval's */
        alone[s] = (stopper){ .at = s % 2 ? 9 + 2 * s : 0 };   /* every other one stopped by its own flag */
        run_set_abort(f, &alone[s].flag);
        gen_callbacks cb = { &alone[s], stop_token, NULL, NULL };
        cr_assert(run_answer(f, &o[s], &cb, &ra[s], err, sizeof err) == RUN_OK, "%s", err);
        end[s] = run_pos(f);
        run_free(f);
    }
    run *fk[FWD_BATCH_MAX];
    gen_callbacks cbs[FWD_BATCH_MAX];
    for (int s = 0; s < n; s++) {
        pol_spec ps;
        cr_assert(pol_parse(&ps, specs[s], NULL, err, sizeof err) == 0, "%s", err);
        cr_assert(fk[s] = run_fork(r, &ps, err, sizeof err), "%s", err);
        both[s] = (stopper){ .at = alone[s].at };
        run_set_abort(fk[s], &both[s].flag);
        cbs[s] = (gen_callbacks){ &both[s], stop_token, NULL, NULL };
    }
    cr_assert(run_answer_batch(r, fk, n, o, cbs, rb, err, sizeof err) == RUN_OK, "%s", err);
    for (int s = 0; s < n; s++) {
        int k = alone[s].t.n;
        cr_expect(both[s].t.n == k && !memcmp(both[s].t.v, alone[s].t.v, sizeof(int32_t) * (size_t)k),
                  "%s under %s: the batch's answer is not the one alone (%d and %d tokens)", path, specs[s],
                  both[s].t.n, k);
        if (alone[s].at) stopped += ra[s].stop == GEN_STOP_INTERRUPT;
        cr_expect(rb[s].n_gen == ra[s].n_gen && rb[s].events == ra[s].events && rb[s].regenerated == ra[s].regenerated &&
                      rb[s].stop == ra[s].stop && rb[s].n_decoded == ra[s].n_decoded,
                  "%s under %s: the results differ (%lld/%lld tokens, %d/%d events, %d/%d again, %lld/%lld steps)", path,
                  specs[s], (long long)rb[s].n_gen, (long long)ra[s].n_gen, rb[s].events, ra[s].events,
                  rb[s].regenerated, ra[s].regenerated, (long long)rb[s].n_decoded, (long long)ra[s].n_decoded);
        events += ra[s].events;
        regen += ra[s].regenerated;
        lens += ra[s].n_gen;
        cr_expect_eq(run_pos(fk[s]), end[s], "the batch left fork %d's cache elsewhere", s);
        run_free(fk[s]);
    }
    cr_expect(regen > 0 && events > 0 && lens > 20, "%s: %d events, %d pages again, %d tokens: nothing went back",
              path, events, regen, lens);
    cr_expect(stopped > 0, "%s: no answer was stopped by its own flag", path);
    cr_expect_eq(run_pos(r), pos0, "the forked run moved");
    cr_expect(same_logits(r, l0), "the forked run's logits changed");
    free(l0);
    run_free(r);
}

Test(run, answers_of_forks_in_one_batch_are_each_as_alone)
{
    const char *g[] = { "full", "quest:budget=24", "chess:preset=aggressive,window=1", "streaming:budget=40" };
    batch_equals_alone(GEMMA, g, 4);
    const char *l[] = { "full", "quest:budget=16", "sentkv:budget=60,len=6,delta=3" };
    batch_equals_alone(LLAMA, l, 3);
}
