/* test_pick.c - the token chosen from a backend's best candidates (be_pick) is the token the sampler
 * chooses from the whole row: the CPU backend's pick against a sort of every key, its entropy
 * against samp_entropy bit for bit, samp_sample_top against samp_sample over random rows and
 * settings, and answers (sampled, penalized, backtracking) on the tiny models with and without the
 * backend's pick. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/logit_pick.h"
#include "engine/forward.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "kernels/backend.h"
#include "tests/fwd_fixture.h"

#define TD "../shared/testdata/"

static uint64_t rng_state;
static uint32_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}
static float rndf(void) { return (float)rnd() / 2147483648.0f; }   /* [0, 1) */

/* A row of logits with what real rows and bad ones hold: many ties (values on a coarse grid), NaN,
 * both infinities now and then, -0 beside +0. */
static void fill_row(float *l, int32_t n, int kind)
{
    for (int32_t i = 0; i < n; i++) {
        float v = kind == 0 ? (rndf() - 0.5f) * 30.0f : (float)((int)(rnd() % 16) - 8) * 0.5f;
        uint32_t r = rnd() % 1000;
        if (r == 0) v = NAN;
        else if (r == 1) v = -INFINITY;
        else if (r == 2 && kind == 2) v = INFINITY;
        else if (r < 6) v = -0.0f;
        else if (r < 10) v = 0.0f;
        l[i] = v;
    }
}

static int cmp_u64_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x < y) - (x > y);
}

Test(pick, the_cpu_pick_is_the_best_of_a_sort_of_every_key_and_its_entropy_the_samplers)
{
    char err[256];
    be_backend *b = be_cpu_create(1, err, sizeof err);
    cr_assert(b, "%s", err);
    cr_assert(b->ops->pick);
    rng_state = 7;
    const int32_t sizes[] = { 1, 5, 300, 4099, 262144 };
    const int32_t ks[] = { 1, 7, 40, 256 };
    float *row = malloc(sizeof(float) * 262144), *capped = malloc(sizeof(float) * 262144);
    float *orig = malloc(sizeof(float) * 262144);
    uint64_t *keys = malloc(sizeof(uint64_t) * 262144);
    int32_t pen[300];
    for (int round = 0; round < 60; round++) {
        int32_t n = sizes[round % 5], k = ks[(round / 5) % 4];
        float cap = round % 3 == 2 ? 30.0f : 0.0f, penalty = round % 4 == 0 ? 1.0f : round % 4 == 1 ? 1.3f : 0.7f;
        fill_row(row, n, round % 3);
        memcpy(orig, row, sizeof(float) * (size_t)n);
        /* distinct penalized ids */
        int32_t n_pen = 0;
        for (int32_t i = 0; i < n && n_pen < 300; i += 1 + (int32_t)(rnd() % 23)) pen[n_pen++] = i;
        for (int32_t i = n_pen - 1; i > 0; i--) {   /* in no order */
            int32_t j = (int32_t)(rnd() % (uint32_t)(i + 1)), t = pen[i];
            pen[i] = pen[j];
            pen[j] = t;
        }
        float val[256];
        int32_t id[256];
        be_pick p = { row, n, cap, pen, n_pen, penalty, k, 1, round % 2 ? 0.8f : 0.0f, val, id, -1, -1, -1 };
        b->ops->pick(b, &p, 1);
        /* the row is soft-capped in place, as the forward pass capped a row it read */
        for (int32_t i = 0; i < n; i++) capped[i] = cap > 0 ? lp_cap(orig[i], cap) : orig[i];
        cr_assert(!memcmp(row, capped, sizeof(float) * (size_t)n), "round %d: the row after the pick", round);
        /* the reference: every value, penalized, keyed and sorted */
        int32_t nk = 0;
        for (int32_t i = 0; i < n; i++) {
            float v = lp_value(cap > 0 ? lp_cap(orig[i], cap) : orig[i]);
            for (int32_t j = 0; j < n_pen; j++)
                if (pen[j] == i) v = lp_penalize(v, penalty);
            if (v > -INFINITY) keys[nk++] = lp_key(v, i);
        }
        qsort(keys, (size_t)nk, sizeof keys[0], cmp_u64_desc);
        int32_t want = nk < k ? nk : k;
        cr_assert_eq(p.n_out, want, "round %d: %d candidates, want %d", round, p.n_out, want);
        for (int32_t i = 0; i < want; i++) {
            cr_assert_eq(id[i], lp_key_id(keys[i]), "round %d: candidate %d is %d, want %d", round, i, id[i],
                         lp_key_id(keys[i]));
            cr_assert(val[i] == lp_key_value(keys[i]), "round %d: candidate %d's value", round, i);
        }
        /* the entropy is samp_entropy's over the capped row, bit for bit */
        double h, vh;
        samp_entropy(capped, n, p.temp, &h, &vh);
        cr_assert(memcmp(&h, &p.h, sizeof h) == 0 && memcmp(&vh, &p.vh, sizeof vh) == 0,
                  "round %d: entropy %.17g/%.17g, samp_entropy %.17g/%.17g", round, p.h, p.vh, h, vh);
    }
    free(row);
    free(capped);
    free(orig);
    free(keys);
    be_free(b);
}

Test(pick, lp_key_orders_values_then_ids_and_round_trips)
{
    const float v[] = { -INFINITY, -1e30f, -2.5f, -1e-40f, -0.0f, 0.0f, 1e-40f, 1.0f, 3e38f, INFINITY };
    for (int i = 0; i < 10; i++)
        for (int j = 0; j < 10; j++)
            for (int32_t a = 0; a < 3; a++)
                for (int32_t c = 0; c < 3; c++) {
                    int before = v[i] > v[j] || (v[i] == v[j] && a < c);
                    cr_assert_eq(lp_key(v[i], a) > lp_key(v[j], c), before, "%g/%d against %g/%d", v[i], a, v[j], c);
                }
    for (int i = 0; i < 10; i++) {
        uint64_t key = lp_key(v[i], 262143);
        cr_assert(key != 0);
        cr_assert(lp_key_value(key) == v[i] && lp_key_id(key) == 262143);
    }
    cr_assert(signbit(lp_key_value(lp_key(-0.0f, 4))) == 0, "-0 is read as +0");
    cr_assert(lp_value(NAN) == -INFINITY && lp_value(lp_cap(NAN, 30)) == -INFINITY);
}

/* Two samplers with one history: one chooses from the CPU backend's candidates (the whole row when
 * they do not settle it), the other from the row; every draw must agree. */
Test(pick, choosing_from_the_candidates_is_samp_sample)
{
    char err[256];
    be_backend *b = be_cpu_create(1, err, sizeof err);
    cr_assert(b, "%s", err);
    rng_state = 11;
    const int32_t n = 3000;
    float *row = malloc(sizeof(float) * n), *a = malloc(sizeof(float) * n), *c = malloc(sizeof(float) * n);
    int fast = 0, slow = 0;
    for (int setting = 0; setting < 96; setting++) {
        samp_params sp = samp_params_default();
        const float temps[] = { 0.0f, 0.3f, 0.8f, 1.5f };
        const int32_t top_ks[] = { 0, 1, 5, 40, 300 };
        sp.temperature = temps[setting % 4];
        sp.top_k = top_ks[(setting / 4) % 5];
        sp.top_p = setting % 3 == 0 ? 1.0f : 0.9f;
        sp.min_p = setting % 5 == 0 ? 0.0f : setting % 5 == 1 ? 0.5f : 0.05f;
        sp.repeat_penalty = setting % 7 == 0 ? 1.0f : 1.3f;
        sp.repeat_last_n = 32;
        sp.seed = (uint64_t)setting;
        samp *s1 = samp_create(&sp, n), *s2 = samp_create(&sp, n);
        for (int draw = 0; draw < 40; draw++) {
            fill_row(row, n, (setting + draw) % 3);
            int32_t pen[4096], k;
            float penalty;
            int32_t n_pen = samp_pick_request(s1, BE_PICK_MAX, pen, &penalty, &k);
            float val[BE_PICK_MAX];
            int32_t id[BE_PICK_MAX];
            be_pick p = { row, n, 0, pen, n_pen, penalty, k, 0, 0, val, id, 0, 0, 0 };
            b->ops->pick(b, &p, 1);
            int32_t got = samp_sample_top(s1, val, id, p.n_out, k);
            if (got < 0) {
                memcpy(a, row, sizeof(float) * n);
                got = samp_sample(s1, a);
                slow++;
            } else {
                fast++;
            }
            memcpy(c, row, sizeof(float) * n);
            int32_t want = samp_sample(s2, c);
            cr_assert_eq(got, want, "setting %d draw %d: %d from the candidates, %d from the row", setting, draw, got,
                         want);
            samp_accept(s1, got);
            samp_accept(s2, want);
        }
        samp_free(s1);
        samp_free(s2);
    }
    /* the whole row is needed only without top-k and with min-p too loose for the few candidates */
    cr_expect(fast > 3 * slow, "%d draws from the candidates, %d from the row", fast, slow);
    cr_expect(slow > 0, "the row was never needed: the fallback went untested");
    free(row);
    free(a);
    free(c);
    be_free(b);
}

/* ---------------------------------------------------------------- answers on the tiny models */

/* A sampled answer with the repetition penalty, pages of 8 watched with thresholds of 0 (every page
 * crosses: backtracking), on the CPU backend with its pick or without it (the row read and sampled). */
static void answer(const char *file, const samp_params *sp, int with_pick, fx_answer *out)
{
    char err[512];
    model *m;
    cr_assert(model_load(&m, file, NULL, err, sizeof err) == 0, "%s", err);
    be_backend *b = be_cpu_create(2, err, sizeof err);
    cr_assert(b, "%s", err);
    be_ops no_pick = *b->ops;
    no_pick.pick = NULL;
    if (!with_pick) b->ops = &no_pick;
    fwd_opts fo = { 2048, 64, 8 };
    fwd_ctx *f = fwd_create(m, b, &fo, err, sizeof err);
    cr_assert(f, "%s", err);
    cr_assert_eq(fwd_can_pick(f), with_pick);
    pol_set *ps = fwd_fixture_policy(f, "chess:rebuild=event");
    size_t n_ids;
    int32_t *ids = fwd_fixture_prompt(m, TD "prompts/p2.txt", &n_ids);
    int32_t nv = m->hp.n_vocab;
    float *logits = malloc(sizeof(float) * (size_t)nv);
    samp *s = samp_create(sp, nv);
    cr_assert(fwd_eval(f, ids, (int64_t)n_ids, logits, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    fwd_set_floor(f, (int64_t)n_ids - 1);
    memset(out, 0, sizeof *out);
    unc_monitor *mon = unc_create(8, 0);
    unc_thresholds thr = { .valid = 1, .h_mean = 0, .h_var = 0 };   /* every page crosses */
    gen_opts go = { 64, ids[n_ids - 1], &thr, 2, sp->temperature, 1, NULL, 0 };
    gen_callbacks cb = fwd_fixture_recorder(out);
    gen_ctx gc = { f, s, m->vocab, mon, logits, nv, NULL };
    cr_assert(gen_answer(&gc, &go, &cb, &out->res, err, sizeof err) == 0, "%s", err);
    unc_free(mon);
    free(logits);
    samp_free(s);
    free(ids);
    fwd_free(f);
    pol_set_free(ps);
    be_free(b);
    model_free(m);
}

Test(pick, answers_are_the_same_with_and_without_the_backends_pick, .timeout = 240)
{
    const char *files[2] = { TD "tiny/tiny-llama-f16.gguf", TD "tiny/tiny-gemma3-q4_k_m.gguf" };
    for (int i = 0; i < 2; i++)
        for (int setting = 0; setting < 3; setting++) {
            samp_params sp = samp_params_default();
            sp.seed = 5 + (uint64_t)setting;
            sp.repeat_penalty = 1.2f;
            if (setting == 1) sp.top_k = 0;   /* min-p alone */
            if (setting == 2) sp.temperature = 0;
            fx_answer a, c;
            answer(files[i], &sp, 1, &a);
            answer(files[i], &sp, 0, &c);
            cr_assert(a.n >= 8, "%s: only %d tokens", files[i], a.n);
            cr_expect(a.n == c.n && !memcmp(a.tok, c.tok, sizeof(int32_t) * (size_t)a.n),
                      "%s setting %d: the answers differ", files[i], setting);
            cr_expect(a.res.regenerated == c.res.regenerated && a.res.events == c.res.events && a.n_ev == c.n_ev,
                      "%s setting %d: the backtracking differs", files[i], setting);
            cr_expect(a.n_page == c.n_page && !memcmp(a.page, c.page, sizeof(unc_stats) * (size_t)a.n_page),
                      "%s setting %d: the pages' entropy differs", files[i], setting);
            if (setting == 0)
                cr_expect(a.res.regenerated > 0, "%s: no page was generated again: backtracking went untested",
                          files[i]);
        }
}

/* A model with a final soft cap: the pick caps the row where it lies, and the row read after it is
 * the one fwd_decode gives (capped on the host), bit for bit; its candidates and entropy are that
 * row's. */
Test(pick, a_soft_capped_row_reads_the_same_after_the_pick)
{
    char err[512];
    model *m;
    cr_assert(model_load(&m, TD "tiny/tiny-llama-f16.gguf", NULL, err, sizeof err) == 0, "%s", err);
    m->hp.final_softcap = 2.5f;   /* strong enough to change every large logit */
    be_backend *b = be_cpu_create(2, err, sizeof err);
    cr_assert(b, "%s", err);
    size_t n_ids;
    int32_t *ids = fwd_fixture_prompt(m, TD "prompts/p1.txt", &n_ids);
    int32_t nv = m->hp.n_vocab;
    float *l1 = malloc(sizeof(float) * (size_t)nv), *l2 = malloc(sizeof(float) * (size_t)nv);
    fwd_opts fo = { 2048, 64, 16 };
    fwd_ctx *f1 = fwd_create(m, b, &fo, err, sizeof err), *f2 = fwd_create(m, b, &fo, err, sizeof err);
    cr_assert(f1 && f2, "%s", err);
    cr_assert(fwd_eval(f1, ids, (int64_t)n_ids, l1, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    cr_assert(fwd_eval(f2, ids, (int64_t)n_ids, l2, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    int32_t tok = samp_argmax(l1, nv);
    cr_assert(fwd_decode(f1, tok, l1, NULL, err, sizeof err) == 0, "%s", err);
    float val[40];
    int32_t id[40];
    be_pick p = { .penalty = 1.0f, .k = 40, .entropy = 1, .temp = 0.8f, .val = val, .id = id };
    cr_assert(fwd_decode_pick(f2, tok, &p, NULL, err, sizeof err) == 0, "%s", err);
    cr_assert(fwd_picked_logits(f2, l2, err, sizeof err) == 0, "%s", err);
    cr_expect(!memcmp(l1, l2, sizeof(float) * (size_t)nv), "the row after the pick is not fwd_decode's");
    float mx = -INFINITY;
    for (int32_t i = 0; i < nv; i++) mx = l1[i] > mx ? l1[i] : mx;
    cr_expect(mx <= 2.5f, "the row was not capped: %g", mx);
    cr_assert_eq(p.n_out, 40);
    for (int i = 1; i < 40; i++) cr_assert(lp_key(val[i - 1], id[i - 1]) > lp_key(val[i], id[i]));
    for (int i = 0; i < 40; i++) cr_assert(val[i] == l1[id[i]], "candidate %d's value is not the row's", i);
    int32_t above = 0;   /* nothing outside the candidates beats the last of them */
    for (int32_t i = 0; i < nv; i++) above += lp_key(l1[i], i) > lp_key(val[39], id[39]);
    cr_expect_eq(above, 39);
    double h, vh;
    samp_entropy(l1, nv, 0.8f, &h, &vh);
    cr_expect(h == p.h && vh == p.vh, "entropy %g / %g, the row's %g / %g", p.h, p.vh, h, vh);
    cr_assert(fwd_rewind(f2, (int64_t)n_ids) == (int64_t)n_ids);
    cr_expect(fwd_picked_logits(f2, l2, err, sizeof err) != 0, "a rewound row was still handed out");
    free(l1);
    free(l2);
    free(ids);
    fwd_free(f1);
    fwd_free(f2);
    be_free(b);
    model_free(m);
}
