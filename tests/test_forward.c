/* test_forward.c - forward-pass behaviour beyond the reference numbers: a cancelled prefill leaves
 * the cache as it was, prefill chunk size does not change the result, a decode step gives the bits of
 * prefill, every instruction set gives the portable kernels' bits, rewinding and re-evaluating
 * reproduces the same logits, and a prompt that does not fit is refused before any work. */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "engine/forward.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "kernels/cpu/vec_dot.h"

#define TD "../shared/testdata/"

static model *M;
static be_backend *B;

static void setup(void)
{
    char err[512];
    cr_assert(model_load(&M, TD "tiny/tiny-gemma3-q4_k_m.gguf", NULL, err, sizeof err) == 0, "%s", err);
    B = be_cpu_create(1, err, sizeof err);
    cr_assert(B, "%s", err);
}

static void teardown(void)
{
    be_free(B);
    model_free(M);
}

TestSuite(forward, .init = setup, .fini = teardown);

static int32_t *prompt_ids(size_t *n)
{
    FILE *f = fopen(TD "prompts/p2.txt", "rb");
    cr_assert(f);
    static char text[8192];
    size_t tl = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    int32_t *ids;
    char err[256];
    cr_assert(tok_encode(M->vocab, text, tl, 1, 0, &ids, n, err, sizeof err) == 0, "%s", err);
    return ids;
}

static float *eval_all(int n_batch, const int32_t *ids, size_t n)
{
    char err[256];
    fwd_opts fo = { 2048, n_batch, 0 };
    fwd_ctx *f = fwd_create(M, B, &fo, err, sizeof err);
    cr_assert(f, "%s", err);
    float *l = malloc(sizeof(float) * (size_t)M->hp.n_vocab);
    cr_assert(fwd_eval(f, ids, (int64_t)n, l, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    fwd_free(f);
    return l;
}

static volatile sig_atomic_t stop_flag;
static void stop_after_two_chunks(void *ud, int64_t done, int64_t total)
{
    (void)ud;
    (void)total;
    if (done >= 128) stop_flag = 1;
}

Test(forward, cancelled_prefill_leaves_the_cache_untouched)
{
    size_t n;
    int32_t *ids = prompt_ids(&n);
    char err[256];
    fwd_opts fo = { 2048, 64, 0 };
    fwd_ctx *f = fwd_create(M, B, &fo, err, sizeof err);
    cr_assert(f);
    float *l = malloc(sizeof(float) * (size_t)M->hp.n_vocab);
    cr_assert(fwd_eval(f, ids, 20, l, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0);
    stop_flag = 0;
    cr_expect_eq(fwd_eval(f, ids + 20, (int64_t)n - 20, l, NULL, NULL, stop_after_two_chunks, NULL, &stop_flag, err,
                          sizeof err),
                 -1);
    cr_expect(strstr(err, "cancelled"), "%s", err);
    cr_expect_eq(fwd_pos(f), 20, "the 20 tokens before the cancelled call stay, nothing else");
    /* continuing from there gives exactly the uncancelled result */
    cr_assert(fwd_eval(f, ids + 20, (int64_t)n - 20, l, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    float *ref = eval_all(64, ids, n);
    cr_expect(!memcmp(l, ref, sizeof(float) * (size_t)M->hp.n_vocab), "logits differ after a cancel");
    free(ref);
    free(l);
    free(ids);
    fwd_free(f);
}

/* The CPU backend with a glu that raises stop_flag at its n-th call: a Ctrl-C arriving in the middle
 * of a layer stack, where the abort check before the next layer sees it. */
static be_ops counting_ops;
static const be_ops *cpu_ops_orig;
static int glu_calls, glu_stop_at;
static void glu_then_stop(be_backend *b, float *gate, const float *up, int64_t n, int gelu)
{
    cpu_ops_orig->glu(b, gate, up, n, gelu);
    if (++glu_calls == glu_stop_at) stop_flag = 1;
}

Test(forward, ctrl_c_in_the_middle_of_a_decode_step_leaves_no_half_token)
{
    size_t n;
    int32_t *ids = prompt_ids(&n);
    char err[256];
    fwd_opts fo = { 2048, 64, 0 };
    fwd_ctx *f = fwd_create(M, B, &fo, err, sizeof err);
    cr_assert(f, "%s", err);
    int nv = M->hp.n_vocab;
    float *l = malloc(sizeof(float) * (size_t)nv), *want = malloc(sizeof(float) * (size_t)nv);
    cr_assert(fwd_eval(f, ids, 40, l, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    cr_assert(fwd_decode(f, ids[40], want, NULL, err, sizeof err) == 0, "%s", err);
    fwd_rewind(f, 40);
    /* the same step again, stopped after the third layer's feed-forward block */
    cpu_ops_orig = B->ops;
    counting_ops = *B->ops;
    counting_ops.glu = glu_then_stop;
    B->ops = &counting_ops;
    glu_calls = 0;
    glu_stop_at = 3;
    stop_flag = 0;
    cr_expect_eq(fwd_decode(f, ids[40], l, &stop_flag, err, sizeof err), -1);
    B->ops = cpu_ops_orig;
    cr_expect(strstr(err, "cancelled"), "%s", err);
    cr_expect_eq(fwd_pos(f), 40);
    /* every layer holds exactly the 40 tokens: the stopped step left nothing behind */
    for (int il = 0; il < M->hp.n_layer; il++) {
        const kv_cache *kv = fwd_kv(f);
        int np = kv_n_pages(kv, il, 0);
        const kv_page *last = kv_layer_page(kv, il, 0, np - 1);
        cr_expect_lt(last->pos[last->n - 1], 40, "layer %d still holds position %d", il, last->pos[last->n - 1]);
    }
    cr_assert(fwd_decode(f, ids[40], l, NULL, err, sizeof err) == 0, "%s", err);
    cr_expect(!memcmp(l, want, sizeof(float) * (size_t)nv), "the step after a cancelled one differs");
    free(l);
    free(want);
    free(ids);
    fwd_free(f);
}

Test(forward, chunk_size_does_not_change_the_logits)
{
    size_t n;
    int32_t *ids = prompt_ids(&n);
    float *a = eval_all(512, ids, n), *b = eval_all(37, ids, n);
    double worst = 0;
    for (int32_t i = 0; i < M->hp.n_vocab; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > worst) worst = d;
    }
    /* a token's sums go the same way in any batch (the panel kernels and the one-token kernels apply
     * the same integer block sums in the same order; attention blocks follow key positions) */
    cr_expect(!memcmp(a, b, sizeof(float) * (size_t)M->hp.n_vocab), "chunks of 512 vs 37: max |diff| %g", worst);
    free(a);
    free(b);
    free(ids);
}

/* A token decoded on its own gives the bits it gets in a prefill batch, on every instruction set this
 * CPU has and on both tiny models: branches and resumes that replay lost tokens in a batch then
 * continue exactly. (A step over 8 pages or more is split over the threads, which sums it otherwise.) */
Test(forward, a_decode_step_gives_the_bits_of_prefill_on_every_isa)
{
    char err[512];
    vd_isa was = vd_isa_active();
    static const char *files[] = { TD "tiny/tiny-gemma3-q4_k_m.gguf", TD "tiny/tiny-llama-q4_k_m.gguf",
                                   TD "tiny/tiny-gemma3-f16.gguf" };
    size_t n;
    int32_t *ids = prompt_ids(&n);
    cr_assert(n >= 100);
    for (int isa = 0; isa < VD_ISA_COUNT; isa++) {
        if (!vd_isa_supported((vd_isa)isa)) {
            fprintf(stderr, "[forward] SKIP decode vs prefill on %s: this CPU lacks %s\n", vd_isa_name((vd_isa)isa),
                    vd_isa_describe((vd_isa)isa));
            continue;
        }
        cr_assert_eq(vd_set_isa((vd_isa)isa, err, sizeof err), 0, "%s", err);
        for (int fi = 0; fi < 3; fi++) {
            model *m;
            cr_assert(model_load(&m, files[fi], NULL, err, sizeof err) == 0, "%s", err);
            be_backend *b = be_cpu_create(2, err, sizeof err);
            cr_assert(b, "%s", err);
            int nv = m->hp.n_vocab;
            float *la = malloc(sizeof(float) * (size_t)nv), *lb = malloc(sizeof(float) * (size_t)nv);
            const int N = 100;
            fwd_opts fo = { 2048, 48, 16 };   /* chunks of 48: batches of 48 and 4 */
            for (int K = 1; K <= 13; K += 12) {
                fwd_ctx *f = fwd_create(m, b, &fo, err, sizeof err);
                cr_assert(f, "%s", err);
                cr_assert(fwd_eval(f, ids, N, la, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
                fwd_free(f);
                f = fwd_create(m, b, &fo, err, sizeof err);
                cr_assert(fwd_eval(f, ids, N - K, lb, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
                for (int t = N - K; t < N; t++)
                    cr_assert(fwd_decode(f, ids[t], lb, NULL, err, sizeof err) == 0, "%s", err);
                fwd_free(f);
                int bad = 0;
                for (int i = 0; i < nv; i++) bad += memcmp(&la[i], &lb[i], sizeof(float)) != 0;
                cr_expect_eq(bad, 0, "%s on %s: %d of %d logits differ after %d decode steps", files[fi],
                             vd_isa_name((vd_isa)isa), bad, nv, K);
            }
            free(la);
            free(lb);
            be_free(b);
            model_free(m);
        }
    }
    cr_assert_eq(vd_set_isa(was, err, sizeof err), 0, "%s", err);
    free(ids);
}

/* Every instruction set gives the portable kernels' bits (the kernels keep one order of f32
 * operations), so an answer never depends on the CPU that computed it: a prefill in batches of 48
 * and 4 (panel and rows kernels, blocked attention) and 4 decode steps after it, on all four tiny
 * models (Q4_K_M with Q5_0/Q8_0/Q6_K, and f16 weights; GELU and SiLU). */
Test(forward, every_isa_gives_the_portable_logits)
{
    char err[512];
    vd_isa was = vd_isa_active();
    static const char *files[] = { TD "tiny/tiny-gemma3-q4_k_m.gguf", TD "tiny/tiny-llama-q4_k_m.gguf",
                                   TD "tiny/tiny-gemma3-f16.gguf", TD "tiny/tiny-llama-f16.gguf" };
    size_t n;
    int32_t *ids = prompt_ids(&n);
    cr_assert(n >= 104);
    for (int fi = 0; fi < 4; fi++) {
        model *m;
        cr_assert(model_load(&m, files[fi], NULL, err, sizeof err) == 0, "%s", err);
        be_backend *b = be_cpu_create(2, err, sizeof err);
        cr_assert(b, "%s", err);
        int nv = m->hp.n_vocab;
        float *ref = malloc(sizeof(float) * (size_t)nv * 5), *got = malloc(sizeof(float) * (size_t)nv * 5);
        for (int isa = 0; isa < VD_ISA_COUNT; isa++) {
            if (!vd_isa_supported((vd_isa)isa)) continue;
            cr_assert_eq(vd_set_isa((vd_isa)isa, err, sizeof err), 0, "%s", err);
            float *out = isa == VD_ISA_SCALAR ? ref : got;
            fwd_opts fo = { 2048, 48, 16 };
            fwd_ctx *f = fwd_create(m, b, &fo, err, sizeof err);
            cr_assert(f, "%s", err);
            cr_assert(fwd_eval(f, ids, 100, out, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
            for (int t = 0; t < 4; t++)
                cr_assert(fwd_decode(f, ids[100 + t], out + (size_t)(t + 1) * nv, NULL, err, sizeof err) == 0, "%s", err);
            fwd_free(f);
            if (isa == VD_ISA_SCALAR) continue;
            for (int step = 0; step < 5; step++) {
                int bad = 0;
                for (int i = 0; i < nv; i++)
                    bad += memcmp(&out[(size_t)step * nv + i], &ref[(size_t)step * nv + i], sizeof(float)) != 0;
                cr_expect_eq(bad, 0, "%s on %s: %d of %d logits differ from the portable kernels' at step %d", files[fi],
                             vd_isa_name((vd_isa)isa), bad, nv, step);
            }
        }
        free(ref);
        free(got);
        be_free(b);
        model_free(m);
    }
    cr_assert_eq(vd_set_isa(was, err, sizeof err), 0, "%s", err);
    free(ids);
}

Test(forward, rewind_and_replay_reproduces_the_logits)
{
    size_t n;
    int32_t *ids = prompt_ids(&n);
    char err[256];
    fwd_opts fo = { 2048, 64, 0 };
    fwd_ctx *f = fwd_create(M, B, &fo, err, sizeof err);
    float *l1 = malloc(sizeof(float) * (size_t)M->hp.n_vocab), *l2 = malloc(sizeof(float) * (size_t)M->hp.n_vocab);
    cr_assert(fwd_eval(f, ids, 300, l1, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0);
    cr_assert(fwd_eval(f, ids + 300, 5, l1, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0);
    fwd_rewind(f, 300);
    cr_expect_eq(fwd_pos(f), 300);
    cr_assert(fwd_eval(f, ids + 300, 5, l2, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0);
    cr_expect(!memcmp(l1, l2, sizeof(float) * (size_t)M->hp.n_vocab));
    free(l1);
    free(l2);
    free(ids);
    fwd_free(f);
}

Test(forward, too_long_for_the_context_is_refused_up_front)
{
    size_t n;
    int32_t *ids = prompt_ids(&n);
    char err[256];
    fwd_opts fo = { 256, 64, 0 };
    fwd_ctx *f = fwd_create(M, B, &fo, err, sizeof err);
    float *l = malloc(sizeof(float) * (size_t)M->hp.n_vocab);
    cr_expect_eq(fwd_eval(f, ids, (int64_t)n, l, NULL, NULL, NULL, NULL, NULL, err, sizeof err), -1);
    cr_expect(strstr(err, "do not fit in the context"), "%s", err);
    cr_expect_eq(fwd_pos(f), 0);
    int32_t bad = 999999;
    cr_expect_eq(fwd_eval(f, &bad, 1, l, NULL, NULL, NULL, NULL, NULL, err, sizeof err), -1);
    cr_expect(strstr(err, "out of range"), "%s", err);
    free(l);
    free(ids);
    fwd_free(f);
}
