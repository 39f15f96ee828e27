/* test_kvcache.c - the paged KV cache and attention over page lists: page summaries equal a direct
 * computation, rewind and sliding-window trimming keep exactly what they promise, memory figures
 * follow the allocator, and attention over an arbitrary page list (masks, per-token bias, per-KV-head
 * lists, sliding window) equals a double-precision softmax over the same f16 keys and values. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "engine/bytes.h"
#include "engine/kvcache.h"
#include "common/quant.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static float h(float x) { return quant_fp16_to_f32(quant_f32_to_fp16(x)); }

static kv_cache *make(int n_layer, int R, int P, const int32_t *win, int64_t n_tok, float **keys_out)
{
    char err[256];
    kv_cache *kv = kv_create(n_layer, 4096, 1, R, P, win, err, sizeof err);
    cr_assert(kv, "%s", err);
    float *k = malloc(sizeof(float) * (size_t)(n_tok * R)), *v = malloc(sizeof(float) * (size_t)(n_tok * R));
    for (int64_t i = 0; i < n_tok * R; i++) {
        k[i] = frand();
        v[i] = frand();
    }
    for (int il = 0; il < n_layer; il++) cr_assert(kv_append(kv, il, k, v, n_tok, 0) == 0);
    kv_commit(kv, n_tok);
    free(v);
    if (keys_out) *keys_out = k;
    else free(k);
    return kv;
}

Test(kvcache, pages_fill_in_order_and_summaries_match_the_keys)
{
    const int R = 24, P = 8;
    float *k;
    kv_cache *kv = make(1, R, P, NULL, 61, &k);
    cr_expect_eq(kv_n_pages(kv, 0, 0), 8);
    cr_expect_eq(kv_head_tokens(kv, 0, 0), 61);
    for (int i = 0; i < 8; i++) {
        const kv_page *p = kv_layer_page(kv, 0, 0, i);
        cr_expect_eq(p->n, i < 7 ? P : 61 - 7 * P);
        for (int t = 0; t < p->n; t++) cr_expect_eq(p->pos[t], i * P + t);
        for (int d = 0; d < R; d++) {
            double sum = 0, mn = DBL_MAX, mx = -DBL_MAX;
            for (int t = 0; t < p->n; t++) {
                float x = h(k[(size_t)(i * P + t) * R + d]);
                cr_assert_eq(quant_fp16_to_f32(p->k[(size_t)t * R + d]), x);
                sum += x;
                mn = fmin(mn, x);
                mx = fmax(mx, x);
            }
            cr_expect(fabs(sum - p->ksum[d]) < 1e-5, "page %d dim %d: sum %g vs %g", i, d, sum, p->ksum[d]);
            cr_expect_eq(p->kmin[d], (float)mn);
            cr_expect_eq(p->kmax[d], (float)mx);
        }
    }
    free(k);
    kv_free(kv);
}

Test(kvcache, rewind_truncates_and_resummarizes)
{
    const int R = 16, P = 8;
    float *k;
    kv_cache *kv = make(2, R, P, NULL, 40, &k);
    cr_expect_eq(kv_rewind(kv, 21), 21);
    cr_expect_eq(kv_len(kv), 21);
    for (int il = 0; il < 2; il++) {
        cr_expect_eq(kv_n_pages(kv, il, 0), 3);
        cr_expect_eq(kv_head_tokens(kv, il, 0), 21);
        const kv_page *p = kv_layer_page(kv, il, 0, 2);
        cr_expect_eq(p->n, 5);
        for (int d = 0; d < R; d++) {
            float mx = -FLT_MAX;
            for (int t = 16; t < 21; t++) mx = fmaxf(mx, h(k[(size_t)t * R + d]));
            cr_expect_eq(p->kmax[d], mx);
        }
    }
    free(k);
    kv_free(kv);
}

/* A device copy of a page trusts its rows while the page's generation stays: appends keep it, while
 * a truncation (rows to be written again), a reused page and packed pages get new ones. */
Test(kvcache, content_generations_change_exactly_when_rows_are_rewritten)
{
    const int R = 8, P = 8;
    kv_cache *kv = make(1, R, P, NULL, 20, NULL);
    const kv_page *p2 = kv_layer_page(kv, 0, 0, 2);
    uint64_t g0 = kv_layer_page(kv, 0, 0, 0)->gen, g2 = p2->gen;
    cr_expect_neq(g0, g2, "pages get generations of their own");
    float k[8 * 3] = { 0 }, v[8 * 3] = { 0 };
    cr_assert(kv_append(kv, 0, k, v, 3, 20) == 0);   /* rows 4..6 of page 2 */
    kv_commit(kv, 23);
    cr_expect_eq(kv_layer_page(kv, 0, 0, 2)->gen, g2, "an append keeps the generation");
    cr_expect_eq(kv_layer_page(kv, 0, 0, 0)->gen, g0);
    cr_expect_eq(kv_rewind(kv, 18), 18);   /* page 2 keeps 2 rows; the next append rewrites row 2 */
    uint64_t g2b = kv_layer_page(kv, 0, 0, 2)->gen;
    cr_expect_neq(g2b, g2, "a truncation gives a new generation");
    cr_expect_eq(kv_layer_page(kv, 0, 0, 0)->gen, g0, "untouched pages keep theirs");
    cr_expect_eq(kv_rewind(kv, 8), 8);       /* pages 1 and 2 go back to the pool */
    cr_assert(kv_append(kv, 0, k, v, 3, 8) == 0);
    kv_commit(kv, 11);
    uint64_t g1 = kv_layer_page(kv, 0, 0, 1)->gen;
    cr_expect(g1 != g2 && g1 != g2b && g1 > g2b, "a reused page starts a new generation");
    int64_t keep[] = { 0, 3, 9 };
    cr_assert(kv_keep_tokens(kv, 0, 0, keep, 3) == 0);
    cr_expect_gt(kv_layer_page(kv, 0, 0, 0)->gen, g1, "packed pages are new generations");
    kv_free(kv);
}

Test(kvcache, sliding_window_layers_keep_only_what_queries_and_rewinds_need)
{
    const int R = 8, P = 4;
    int32_t win[2] = { 0, 10 };
    kv_cache *kv = make(2, R, P, win, 64, NULL);
    /* the next query is at 64; protect the floor 0 (nothing before it) and the eval start 64 */
    kv_trim_window(kv, 1, 64, 64);
    cr_expect_eq(kv_head_tokens(kv, 0, 0), 64, "global layers are never trimmed");
    /* positions >= 64 - 10 + 1 = 55 are needed: pages [52..55] .. [60..63] */
    cr_expect_eq(kv_n_pages(kv, 1, 0), 3);
    cr_expect_eq(kv_layer_page(kv, 1, 0, 0)->pos[0], 52);
    /* a rewind to 60 still finds positions 51..59? 51 is gone: the rewind restarts from 0 */
    kv_free(kv);
    kv = make(2, R, P, win, 64, NULL);
    kv_set_floor(kv, 30);
    kv_trim_window(kv, 1, 64, 64);
    /* the floor keeps positions 21..29 (pages 20.., 24.., 28..) as well */
    cr_expect_eq(kv_n_pages(kv, 1, 0), 6);
    cr_expect_eq(kv_rewind(kv, 30), 30, "a rewind to the floor is exact");
    kv_free(kv);
    kv = make(2, R, P, win, 64, NULL);
    kv_trim_window(kv, 1, 64, 64);
    cr_expect_eq(kv_rewind(kv, 40), 0, "a rewind past what the window kept starts over");
    cr_expect_eq(kv_len(kv), 0);
    cr_expect_eq(kv_head_tokens(kv, 0, 0), 0);
    kv_free(kv);
}

Test(kvcache, memory_figures_follow_the_pages)
{
    const int R = 32, P = 16;
    kv_cache *kv = make(3, R, P, NULL, 100, NULL);
    kv_stats st;
    kv_get_stats(kv, &st);
    cr_expect_eq(st.positions, 100);
    cr_expect_eq(st.tokens_kept, 300);
    cr_expect_eq(st.pages, 3 * 7);
    cr_expect_eq(st.bytes_full, 300ull * R * 2 * 2);
    cr_expect_geq(st.bytes_resident, 21 * kv_page_bytes(kv));
    cr_expect_lt(st.bytes_resident, 21 * kv_page_bytes(kv) + 3 * 1024);
    /* dropping pages from the middle of a table gives tokens back (and, past the free list, bytes) */
    int keep[3] = { 0, 5, 6 };
    kv_keep_pages(kv, 1, 0, keep, 3);
    kv_get_stats(kv, &st);
    cr_expect_eq(kv_n_pages(kv, 1, 0), 3);
    cr_expect_eq(st.tokens_kept, 200 + 16 + 16 + 4);
    cr_expect_geq(st.bytes_peak, st.bytes_resident);
    kv_free(kv);
}

/* ---------------------------------------------------------------- attention over page lists */

/* Double-precision attention of one query head over the listed pages. */
static void naive(const be_attn *a, int64_t t, int hq, double *out)
{
    int D = a->head_dim, G = a->n_head / a->n_head_kv, g = hq / G;
    int64_t p0 = a->head_pages ? a->head_pages[g] : 0, p1 = a->head_pages ? a->head_pages[g + 1] : a->n_pages;
    const float *q = a->q + t * a->n_head * D + (int64_t)hq * D;
    int32_t qp = a->q_pos[t];
    double mx = -INFINITY, l = 0;
    for (int i = 0; i < D; i++) out[i] = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t ip = p0; ip < p1; ip++) {
            const be_kv_page *pg = &a->pages[ip];
            for (int32_t j = 0; j < pg->n; j++) {
                int32_t kp = pg->pos[j];
                if (kp > qp || (a->window > 0 && qp - kp >= a->window)) continue;
                if (pg->mask && !((pg->mask[j >> 6] >> (j & 63)) & 1)) continue;
                const uint16_t *kr = pg->k + (size_t)j * pg->stride + (size_t)g * pg->head_step;
                const uint16_t *vr = pg->v + (size_t)j * pg->stride + (size_t)g * pg->head_step;
                double s = pg->bias ? pg->bias[j] : 0;
                for (int i = 0; i < D; i++) s += (double)q[i] * quant_fp16_to_f32(kr[i]);
                if (pass == 0) {
                    if (s > mx) mx = s;
                } else {
                    double w = exp(s - mx);
                    l += w;
                    for (int i = 0; i < D; i++) out[i] += w * quant_fp16_to_f32(vr[i]);
                }
            }
        }
    }
    for (int i = 0; i < D; i++) out[i] = l > 0 ? out[i] / l : 0;
}

static void check_attention(be_backend *b, const be_attn *a)
{
    b->ops->attention(b, a);
    int D = a->head_dim;
    double *ref = malloc(sizeof(double) * (size_t)D);
    double worst = 0;
    for (int64_t t = 0; t < a->n_q; t++) {
        for (int hq = 0; hq < a->n_head; hq++) {
            naive(a, t, hq, ref);
            const float *o = a->out + t * a->n_head * D + (int64_t)hq * D;
            for (int i = 0; i < D; i++) worst = fmax(worst, fabs(o[i] - ref[i]));
        }
    }
    cr_expect(worst < 2e-5, "attention differs from the double-precision reference by %g", worst);
    free(ref);
}

Test(kvcache, attention_over_any_page_list_equals_the_reference)
{
    char err[256];
    const int Hkv = 2, G = 3, D = 40, P = 16, n_tok = 300;
    be_backend *b = be_cpu_create(2, err, sizeof err);
    cr_assert(b, "%s", err);
    kv_cache *kv = make(1, Hkv * D, P, NULL, n_tok, NULL);
    int np = kv_n_pages(kv, 0, 0);
    be_kv_page *pages = calloc((size_t)np * 2, sizeof *pages);
    uint64_t *masks = calloc((size_t)np, sizeof *masks);
    float *bias = malloc(sizeof(float) * P * (size_t)np);
    for (int i = 0; i < P * np; i++) bias[i] = frand();
    /* head 0: every other page, some masked, some with a bias; head 1: all pages, plain */
    int n0 = 0;
    for (int i = 0; i < np; i += 2) {
        const kv_page *p = kv_layer_page(kv, 0, 0, i);
        be_kv_page *r = &pages[n0++];
        r->k = p->k;
        r->v = p->v;
        r->pos = p->pos;
        r->n = p->n;
        r->stride = Hkv * D;
        r->head_step = D;
        if (i % 4 == 0) {
            masks[i] = 0xA5A5ull;
            r->mask = &masks[i];
        }
        if (i % 6 == 0) r->bias = bias + (size_t)i * P;
    }
    for (int i = 0; i < np; i++) {
        const kv_page *p = kv_layer_page(kv, 0, 0, i);
        be_kv_page *r = &pages[n0 + i];
        r->k = p->k;
        r->v = p->v;
        r->pos = p->pos;
        r->n = p->n;
        r->stride = Hkv * D;
        r->head_step = D;
    }
    int64_t head_pages[3] = { 0, n0, n0 + np };
    int n_q = 11;
    float *q = malloc(sizeof(float) * (size_t)(n_q * Hkv * G * D)), *out = malloc(sizeof(float) * (size_t)(n_q * Hkv * G * D));
    for (int i = 0; i < n_q * Hkv * G * D; i++) q[i] = frand() * 0.5f;
    int32_t qpos[11];
    for (int t = 0; t < n_q; t++) qpos[t] = n_tok - n_q + t;
    for (int window = 0; window <= 100; window += 100) {
        /* prefill-shaped: 11 causal queries */
        be_attn a = { q, n_q, qpos, Hkv * G, Hkv, D, pages, n0 + np, head_pages, window, out, NULL, NULL, NULL, 0, 0, 0, 0, NULL, NULL, NULL, 0, NULL, 0, 0 };
        check_attention(b, &a);
        /* decode-shaped: one query, split over pages */
        be_attn d = { q, 1, qpos + n_q - 1, Hkv * G, Hkv, D, pages, n0 + np, head_pages, window, out, NULL, NULL, NULL, 0, 0, 0, 0, NULL, NULL, NULL, 0, NULL, 0, 0 };
        check_attention(b, &d);
        /* one shared list */
        be_attn s = { q, 1, qpos + n_q - 1, Hkv * G, Hkv, D, pages + n0, np, NULL, window, out, NULL, NULL, NULL, 0, 0, 0, 0, NULL, NULL, NULL, 0, NULL, 0, 0 };
        check_attention(b, &s);
    }
    free(q);
    free(out);
    free(bias);
    free(masks);
    free(pages);
    kv_free(kv);
    be_free(b);
}

#include <inttypes.h>
#include <stdio.h>
#include <time.h>

#include "kernels/cpu/vec_dot.h"

/* Prefill-shaped batches through the blocked attention (a tile of queries and their grouped heads
 * sharing key blocks) on every instruction set this CPU has: head sizes that are not a multiple of
 * the vector width, tiles cut short, diagonal blocks (causal), sliding windows cutting through
 * blocks, masked tokens, per-token bias, per-KV-head lists, rows that see nothing in early blocks. */
Test(kvcache, blocked_prefill_attention_equals_the_reference_on_every_isa)
{
    const char *env = getenv("KVCACHE_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL) * 2654435761u + 1;
    fprintf(stderr, "[kvcache] blocked_prefill_attention: seed %" PRIu64 " (KVCACHE_SEED to replay)\n", seed);
    rng = seed | 1;
    char err[256];
    vd_isa was = vd_isa_active();
    static const struct { int Hkv, G, D, P, n_tok, n_q; } shapes[] = {
        { 2, 4, 72, 16, 300, 45 },   /* 8 queries x 4 heads = 32 rows a tile, D with a 8-wide tail */
        { 1, 3, 40, 7, 150, 23 },    /* 10 queries x 3 heads = 30 rows (padded to 32), odd pages */
        { 1, 4, 256, 32, 200, 70 },  /* the default model's shape */
        { 2, 1, 24, 16, 90, 37 },    /* no grouping: 32 queries a tile */
    };
    for (int isa = 0; isa < VD_ISA_COUNT; isa++) {
        if (!vd_isa_supported((vd_isa)isa)) {
            fprintf(stderr, "[kvcache] SKIP blocked attention on %s: this CPU lacks %s\n", vd_isa_name((vd_isa)isa),
                    vd_isa_describe((vd_isa)isa));
            continue;
        }
        cr_assert_eq(vd_set_isa((vd_isa)isa, err, sizeof err), 0, "%s", err);
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int Hkv = shapes[si].Hkv, G = shapes[si].G, D = shapes[si].D, P = shapes[si].P;
            const int n_tok = shapes[si].n_tok, n_q = shapes[si].n_q;
            be_backend *b = be_cpu_create(2, err, sizeof err);
            cr_assert(b, "%s", err);
            kv_cache *kv = make(1, Hkv * D, P, NULL, n_tok, NULL);
            int np = kv_n_pages(kv, 0, 0);
            be_kv_page *pages = calloc((size_t)np * 2, sizeof *pages);
            uint64_t *masks = calloc((size_t)np, sizeof *masks);
            float *bias = malloc(sizeof(float) * (size_t)P * np);
            for (int i = 0; i < P * np; i++) bias[i] = frand();
            /* KV head 0: every page, some masked and some biased; head 1: every other page */
            int n0 = 0;
            for (int pass = 0; pass < 2; pass++)
                for (int i = 0; i < np; i += pass ? 2 : 1) {
                    const kv_page *p = kv_layer_page(kv, 0, 0, i);
                    be_kv_page *r = &pages[n0++];
                    *r = (be_kv_page){ .k = p->k, .v = p->v, .pos = p->pos, .n = p->n, .stride = Hkv * D, .head_step = D };
                    if (pass == 0 && i % 3 == 1) {
                        masks[i] = rng & ((1ull << p->n) - 1);
                        r->mask = &masks[i];
                    }
                    if (pass == 0 && i % 4 == 2) r->bias = bias + (size_t)i * P;
                }
            int64_t head_pages[3] = { 0, np, n0 };
            size_t nqf = (size_t)n_q * Hkv * G * D;
            float *q = malloc(sizeof(float) * nqf), *out = malloc(sizeof(float) * nqf);
            for (size_t i = 0; i < nqf; i++) q[i] = frand() * 0.4f;
            int32_t *qpos = malloc(sizeof(int32_t) * (size_t)n_q);
            for (int t = 0; t < n_q; t++) qpos[t] = n_tok - n_q + t;
            qpos[0] = 2;   /* a query that sees only the first tokens (the rest of its rows see nothing early) */
            for (int window = 0; window <= 41; window += 41) {
                for (size_t i = 0; i < nqf; i++) out[i] = NAN;
                be_attn a = { q, n_q, qpos, Hkv * G, Hkv, D, pages, n0, Hkv == 2 ? head_pages : NULL, window, out,
                              NULL, NULL, NULL, 0, 0, 0, 0, NULL, NULL, NULL, 0, NULL, 0, 0 };
                check_attention(b, &a);
            }
            free(q); free(out); free(qpos); free(bias); free(masks); free(pages);
            kv_free(kv);
            be_free(b);
        }
    }
    cr_assert_eq(vd_set_isa(was, err, sizeof err), 0, "%s", err);
}

Test(kvcache, quest_bound_and_f16_helpers_match_plain_loops)
{
    for (int n = 1; n < 70; n += 3) {
        float q[70], lo[70], hi[70], x[70], y[70], y2[70];
        uint16_t hx[70];
        for (int i = 0; i < n; i++) {
            q[i] = frand();
            float a = frand(), b = frand();
            lo[i] = fminf(a, b);
            hi[i] = fmaxf(a, b);
            x[i] = frand();
            y[i] = y2[i] = frand();
        }
        double want = 0, dot = 0;
        vd_f32_to_f16(n, x, hx);
        for (int i = 0; i < n; i++) {
            want += fmax((double)q[i] * lo[i], (double)q[i] * hi[i]);
            cr_assert_eq(hx[i], quant_f32_to_fp16(x[i]));
            dot += (double)q[i] * quant_fp16_to_f32(hx[i]);
            y2[i] += 0.5f * quant_fp16_to_f32(hx[i]);
        }
        cr_expect(fabs(vd_bound_f32(n, q, lo, hi) - want) < 1e-5, "bound n=%d", n);
        cr_expect(fabs(vd_dot_f32_f16(n, q, hx) - dot) < 1e-5, "dot f16 n=%d", n);
        vd_axpy_f16(n, 0.5f, hx, y);
        for (int i = 0; i < n; i++) cr_expect(fabsf(y[i] - y2[i]) < 1e-6, "axpy f16 n=%d i=%d", n, i);
    }
}

Test(kvcache, keep_tokens_packs_the_kept_rows_and_frees_pages)
{
    const int R = 8, P = 4;
    float *k;
    kv_cache *kv = make(1, R, P, NULL, 40, &k);
    kv_stats before, after;
    kv_get_stats(kv, &before);
    int64_t keep[6] = { 0, 1, 2, 17, 30, 39 };
    cr_assert(kv_keep_tokens(kv, 0, 0, keep, 6) == 0);
    cr_expect_eq(kv_n_pages(kv, 0, 0), 2);
    cr_expect_eq(kv_head_tokens(kv, 0, 0), 6);
    for (int j = 0; j < 6; j++) {
        const kv_page *p = kv_layer_page(kv, 0, 0, j / P);
        cr_expect_eq(p->pos[j % P], keep[j]);
        for (int d = 0; d < R; d++) cr_expect_eq(quant_fp16_to_f32(p->k[(j % P) * R + d]), h(k[keep[j] * R + d]));
    }
    const kv_page *p1 = kv_layer_page(kv, 0, 0, 1);
    for (int d = 0; d < R; d++)
        cr_expect(fabsf(p1->ksum[d] - (h(k[30 * R + d]) + h(k[39 * R + d]))) < 1e-5, "summary of the packed page");
    kv_get_stats(kv, &after);
    cr_expect_eq(after.tokens_kept, 6);
    cr_expect_eq(after.pages, 2);
    free(k);
    kv_free(kv);
}

/* Every page's summary is the row-by-row fold of its keys, bit for bit, and its rows are the
 * appended or kept ones, after appends of every size (a head's rows strided among other heads' or
 * not), evictions of scattered and consecutive tokens (runs copied at once, a kept prefix's full
 * pages left as they are: the same page, the same generation) and rebuilds: the cache fills and
 * summarizes a page's rows a run at a time. */
Test(kvcache, page_summaries_and_rows_after_appends_evictions_and_rebuilds_are_the_row_by_rows)
{
    enum { H = 2, R = 24, P = 8, MAXT = 600 };
    char err[256];
    kv_cache *kv = kv_create(1, 8192, H, R, P, NULL, err, sizeof err);
    cr_assert(kv, "%s", err);
    float *k = malloc(sizeof(float) * MAXT * H * R), *v = malloc(sizeof(float) * MAXT * H * R);
    uint16_t *want_k = malloc(sizeof(uint16_t) * 8192 * R * H);   /* what head h's table should hold, in order */
    int32_t *want_pos = malloc(sizeof(int32_t) * 8192 * H);
    int64_t n_want[H] = { 0 }, *keep = malloc(sizeof(int64_t) * 8192);
    cr_assert(k && v && want_k && want_pos && keep);
    int64_t pos = 0, kept_pages = 0;
    for (int round = 0; round < 120; round++) {
        int what = (int)(rng % 5);
        frand();
        if (what <= 2 || n_want[0] < 4) {   /* an append of 1 to 70 rows, all heads */
            int64_t n = 1 + (int64_t)((rng >> 20) % 70);
            for (int64_t i = 0; i < n * H * R; i++) k[i] = frand() * 3, v[i] = frand();
            if (what == 0)
                cr_assert(kv_append(kv, 0, k, v, n, pos) == 0);
            else
                for (int hh = 0; hh < H; hh++)   /* head hh's rows strided among the others' */
                    cr_assert(kv_append_head(kv, 0, hh, k + hh * R, v + hh * R, H * R, n, pos) == 0);
            for (int hh = 0; hh < H; hh++)
                for (int64_t t = 0; t < n; t++) {
                    for (int d = 0; d < R; d++)
                        want_k[(hh * 8192 + n_want[hh] + t) * R + d] = quant_f32_to_fp16(k[(t * H + hh) * R + d]);
                    want_pos[hh * 8192 + n_want[hh] + t] = (int32_t)(pos + t);
                }
            for (int hh = 0; hh < H; hh++) n_want[hh] += n;
            pos += n;
            kv_commit(kv, pos);
        } else if (what == 3) {   /* keep runs and single tokens of head 1, sometimes after a kept prefix */
            int hh = 1;
            int64_t nk = 0, prefix = frand() > 0 ? (int64_t)((rng >> 17) % (uint64_t)(n_want[hh] + 1)) : 0;
            for (int64_t j = 0; j < n_want[hh]; j++)
                if (j < prefix || (j / 5) % 2 == 0 || frand() > 0.6f) keep[nk++] = j;
            /* the full pages wholly inside the kept prefix must stay as they are */
            int64_t lead = 0;
            while (lead < nk && keep[lead] == lead) lead++;
            const kv_page *was[1024];
            uint64_t was_gen[1024];
            int n_same = 0;
            while (n_same < kv_n_pages(kv, 0, hh) && n_same < 1024 && kv_layer_page(kv, 0, hh, n_same)->n == P &&
                   (int64_t)(n_same + 1) * P <= lead) {
                was[n_same] = kv_layer_page(kv, 0, hh, n_same);
                was_gen[n_same] = was[n_same]->gen;
                n_same++;
            }
            cr_assert(kv_keep_tokens(kv, 0, hh, keep, nk) == 0);
            for (int i = 0; i < n_same; i++)
                cr_assert(kv_layer_page(kv, 0, hh, i) == was[i] && was[i]->gen == was_gen[i],
                          "round %d: page %d of a kept prefix was written again", round, i);
            kept_pages += n_same;
            for (int64_t i = 0; i < nk; i++) {
                memmove(&want_k[(hh * 8192 + i) * R], &want_k[(hh * 8192 + keep[i]) * R], sizeof(uint16_t) * R);
                want_pos[hh * 8192 + i] = want_pos[hh * 8192 + keep[i]];
            }
            n_want[hh] = nk;
        } else {   /* head 0 rebuilt from its own rows, every other one */
            int64_t nk = 0;
            float *kf = malloc(sizeof(float) * (size_t)(n_want[0] * R)), *vf = calloc((size_t)(n_want[0] * R), sizeof(float));
            int32_t *pp = malloc(sizeof(int32_t) * (size_t)n_want[0]);
            cr_assert(kf && vf && pp);
            for (int64_t j = 0; j < n_want[0]; j += 2, nk++) {
                for (int d = 0; d < R; d++) kf[nk * R + d] = quant_fp16_to_f32(want_k[j * R + d]);
                pp[nk] = want_pos[j];
            }
            cr_assert(kv_rebuild_head(kv, 0, 0, kf, vf, pp, NULL, nk) == 0);
            for (int64_t i = 0; i < nk; i++) {
                memmove(&want_k[i * R], &want_k[2 * i * R], sizeof(uint16_t) * R);
                want_pos[i] = want_pos[2 * i];
            }
            n_want[0] = nk;
            free(kf);
            free(vf);
            free(pp);
        }
        for (int hh = 0; hh < H; hh++) {
            int64_t at = 0;
            for (int i = 0; i < kv_n_pages(kv, 0, hh); i++) {
                const kv_page *p = kv_layer_page(kv, 0, hh, i);
                float sum[R], mn[R], mx[R];
                for (int d = 0; d < R; d++) sum[d] = 0, mn[d] = FLT_MAX, mx[d] = -FLT_MAX;
                for (int32_t t = 0; t < p->n; t++) be_host_key_summary(R, p->k + (size_t)t * R, sum, mn, mx);
                cr_assert(!memcmp(sum, p->ksum, sizeof sum) && !memcmp(mn, p->kmin, sizeof mn) &&
                              !memcmp(mx, p->kmax, sizeof mx),
                          "round %d, head %d, page %d: not the row-by-row summary", round, hh, i);
                cr_assert(!memcmp(p->k, &want_k[(hh * 8192 + at) * R], sizeof(uint16_t) * (size_t)(p->n * R)) &&
                              !memcmp(p->pos, &want_pos[hh * 8192 + at], sizeof(int32_t) * (size_t)p->n),
                          "round %d, head %d, page %d: not the rows it should hold", round, hh, i);
                at += p->n;
            }
            cr_assert_eq(at, n_want[hh], "round %d, head %d: %lld tokens, not %lld", round, hh, (long long)at,
                         (long long)n_want[hh]);
        }
    }
    cr_assert(kept_pages > 10, "%lld pages of kept prefixes", (long long)kept_pages);
    free(k);
    free(v);
    free(want_k);
    free(want_pos);
    free(keep);
    kv_free(kv);
}

/* Page list of layer 0's one table, all KV heads side by side in its rows. */
static be_kv_page *page_list(const kv_cache *kv, int R, int D, int *n)
{
    *n = kv_n_pages(kv, 0, 0);
    be_kv_page *pages = calloc((size_t)*n, sizeof *pages);
    for (int i = 0; i < *n; i++) {
        const kv_page *p = kv_layer_page(kv, 0, 0, i);
        pages[i] = (be_kv_page){ .k = p->k, .v = p->v, .pos = p->pos, .n = p->n, .stride = R, .head_step = D };
    }
    return pages;
}

Test(kvcache, rows_not_in_the_cache_yet_attend_like_cached_rows)
{
    /* a decode step that hands attention its own K/V row (the cache takes it after the step) sees
     * what it would see with the row appended first */
    char err[256];
    const int Hkv = 2, G = 2, D = 48, P = 16, n_tok = 150, R = Hkv * D;
    be_backend *b = be_cpu_create(2, err, sizeof err);
    cr_assert(b, "%s", err);
    float *k = malloc(sizeof(float) * (size_t)(n_tok * R)), *v = malloc(sizeof(float) * (size_t)(n_tok * R));
    for (int i = 0; i < n_tok * R; i++) k[i] = frand(), v[i] = frand();
    kv_cache *all = kv_create(1, 4096, 1, R, P, NULL, err, sizeof err), *before = kv_create(1, 4096, 1, R, P, NULL, err, sizeof err);
    cr_assert(all && before, "%s", err);
    cr_assert(kv_append(all, 0, k, v, n_tok, 0) == 0);
    cr_assert(kv_append(before, 0, k, v, n_tok - 1, 0) == 0);
    int na, nb;
    be_kv_page *pa = page_list(all, R, D, &na), *pb = page_list(before, R, D, &nb);
    float q[Hkv * G * D], o1[Hkv * G * D], o2[Hkv * G * D];
    for (int i = 0; i < Hkv * G * D; i++) q[i] = frand() * 0.3f;
    int32_t qp = n_tok - 1;
    for (int window = 0; window <= 40; window += 40) {
        be_attn a = { q, 1, &qp, Hkv * G, Hkv, D, pa, na, NULL, window, o1, NULL, NULL, NULL, 0, 0, 0, 0, NULL, NULL, NULL, 0, NULL, 0, 0 };
        b->ops->attention(b, &a);
        be_attn c = { q, 1, &qp, Hkv * G, Hkv, D, pb, nb, NULL, window, o2, k + (n_tok - 1) * R, v + (n_tok - 1) * R, &qp, 1, 0, 0, 0, NULL, NULL, NULL, 0, NULL, 0, 0 };
        b->ops->attention(b, &c);
        double worst = 0;
        for (int i = 0; i < Hkv * G * D; i++) worst = fmax(worst, fabs((double)o1[i] - o2[i]));
        cr_expect(worst < 1e-6, "window %d: the step's own row attends differently (%g)", window, worst);
    }
    free(pa);
    free(pb);
    free(k);
    free(v);
    kv_free(all);
    kv_free(before);
    be_free(b);
}

/* A selection by bounds (be_attn.sel_best: each KV head's chosen candidates among its first `from`
 * entries, then the rest of its list) attends exactly as the explicit list it stands for, with and
 * without a step's own row after it. */
/* Two KV heads' lists of one cache's pages (each head reads its own rows of them), for the tests of
 * selections that stand for lists: the explicit list's attention against the selection's. */
enum { SR_HKV = 2, SR_G = 3, SR_D = 32, SR_P = 8, SR_NTOK = 120, SR_R = SR_HKV * SR_D };
typedef struct sel_rig {
    be_backend *b;
    float *k, *v;
    kv_cache *kv;
    be_kv_page *pa, *all, *list;
    int na;
    int64_t hp_all[3];
} sel_rig;

static void sel_rig_make(sel_rig *r)
{
    char err[256];
    r->b = be_cpu_create(2, err, sizeof err);
    cr_assert(r->b, "%s", err);
    r->k = malloc(sizeof(float) * (size_t)(SR_NTOK * SR_R));
    r->v = malloc(sizeof(float) * (size_t)(SR_NTOK * SR_R));
    for (int i = 0; i < SR_NTOK * SR_R; i++) r->k[i] = frand(), r->v[i] = frand();
    r->kv = kv_create(1, 4096, 1, SR_R, SR_P, NULL, err, sizeof err);
    cr_assert(r->kv, "%s", err);
    cr_assert(kv_append(r->kv, 0, r->k, r->v, SR_NTOK - 1, 0) == 0);
    r->pa = page_list(r->kv, SR_R, SR_D, &r->na);
    r->all = malloc(sizeof *r->all * (size_t)(2 * r->na));
    r->list = malloc(sizeof *r->list * (size_t)(2 * r->na));
    memcpy(r->all, r->pa, sizeof *r->pa * (size_t)r->na);
    memcpy(r->all + r->na, r->pa, sizeof *r->pa * (size_t)r->na);
    r->hp_all[0] = 0, r->hp_all[1] = r->na, r->hp_all[2] = 2 * r->na;
}

static void sel_rig_free(sel_rig *r)
{
    free(r->all);
    free(r->list);
    free(r->pa);
    free(r->k);
    free(r->v);
    kv_free(r->kv);
    be_free(r->b);
}

/* The explicit list r->list[0 .. e) (offsets hp) attended, then the same call over every page with
 * the selection sel names (its sel_* fields): the same bits, the step's row (cur) or not. */
static void sel_rig_check(sel_rig *r, int64_t e, const int64_t *hp, int cur, const be_attn *sel, const char *what,
                          int round)
{
    float q[SR_HKV * SR_G * SR_D], o1[SR_HKV * SR_G * SR_D], o2[SR_HKV * SR_G * SR_D];
    for (int i = 0; i < SR_HKV * SR_G * SR_D; i++) q[i] = frand() * 0.4f;
    int32_t qp = SR_NTOK - 1;
    const float *ck = r->k + (SR_NTOK - 1) * SR_R, *cv = r->v + (SR_NTOK - 1) * SR_R;
    be_attn a = { q, 1, &qp, SR_HKV * SR_G, SR_HKV, SR_D, r->list, e, hp, 0, o1, cur ? ck : NULL, cur ? cv : NULL,
                  cur ? &qp : NULL, cur, 0, 0, 0, NULL, NULL, NULL, 0, NULL, 0, 0 };
    r->b->ops->attention(r->b, &a);
    be_attn s = a;
    s.pages = r->all;
    s.n_pages = 2 * r->na;
    s.head_pages = r->hp_all;
    s.sel_best = sel->sel_best;
    s.sel_n_best = sel->sel_n_best;
    s.sel_from = sel->sel_from;
    s.sel_k = sel->sel_k;
    s.sel_bits = sel->sel_bits;
    s.sel_words = sel->sel_words;
    s.out = o2;
    r->b->ops->attention(r->b, &s);
    cr_assert(!memcmp(o1, o2, sizeof o1), "round %d: the %s attends differently from its list", round, what);
}

/* A choice of tokens left by bounds (be_attn.sel_bits) attends as the explicit list it stands for:
 * each head's pages with a chosen token, masked where not every token is (random bitmaps, dense and
 * sparse, and one page's tokens not at consecutive positions). */
Test(kvcache, a_choice_of_tokens_attends_like_the_list_it_stands_for)
{
    sel_rig r;
    sel_rig_make(&r);
    /* head 1's third page: tokens at scattered positions (as after an eviction) */
    int32_t odd_pos[SR_P];
    for (int t = 0; t < r.all[r.na + 2].n; t++) odd_pos[t] = 2 * t + 3;
    r.all[r.na + 2].pos = odd_pos;
    enum { WORDS = 3 };
    uint64_t bits[SR_HKV * WORDS], masks[2 * 32];
    for (int round = 0; round < 200; round++) {
        float density = round % 4 == 0 ? 0.02f : round % 4 == 1 ? 0.97f : frand();
        for (int w = 0; w < SR_HKV * WORDS; w++) {
            bits[w] = 0;
            for (int t = 0; t < 64; t++)
                if (frand() < density) bits[w] |= 1ull << t;
        }
        int64_t hp[3], e = 0, mw = 0;
        for (int g = 0; g < SR_HKV; g++) {
            hp[g] = e;
            for (int64_t i = r.hp_all[g]; i < r.hp_all[g + 1]; i++) {
                const be_kv_page *p = &r.all[i];
                uint64_t *m = masks + mw;
                m[0] = 0;
                int on = 0;
                for (int t = 0; t < p->n; t++) {
                    int32_t ps = p->pos[t];
                    if (ps < 64 * WORDS && ((bits[g * WORDS + ps / 64] >> (ps % 64)) & 1)) {
                        m[0] |= 1ull << t;
                        on++;
                    }
                }
                if (!on) continue;
                r.list[e] = *p;
                r.list[e].mask = on == p->n ? NULL : m;
                mw += on == p->n ? 0 : 1;
                e++;
            }
        }
        hp[SR_HKV] = e;
        be_attn sel = { .sel_bits = bits, .sel_words = WORDS };
        sel_rig_check(&r, e, hp, round & 1, &sel, "choice", round);
    }
    sel_rig_free(&r);
}

Test(kvcache, a_selection_by_bounds_attends_like_the_list_it_stands_for)
{
    sel_rig r;
    sel_rig_make(&r);
    int32_t best[2 * 8], n_best[2];
    for (int round = 0; round < 200; round++) {
        int32_t kk = 1 + round % 8;
        int64_t from[2], hp[3], e = 0;
        for (int g = 0; g < SR_HKV; g++) {
            from[g] = r.na - (round / 8) % 3;   /* 0 to 2 pages always attended */
            int32_t c = 0;
            for (int64_t i = 0; i < from[g] && c < kk; i++)
                if (frand() > 0.3f) best[g * kk + c++] = (int32_t)i;
            n_best[g] = c;
            hp[g] = e;
            for (int32_t j = 0; j < c; j++) r.list[e++] = r.all[r.hp_all[g] + best[g * kk + j]];
            for (int64_t i = from[g]; i < r.na; i++) r.list[e++] = r.all[r.hp_all[g] + i];
        }
        hp[SR_HKV] = e;
        be_attn sel = { .sel_best = best, .sel_n_best = n_best, .sel_from = from, .sel_k = kk };
        sel_rig_check(&r, e, hp, round & 1, &sel, "selection", round);
    }
    sel_rig_free(&r);
}

/* ---- forks (kv_fork) */

/* Everything a cache holds, as bytes: kv_save's (shape, positions, every page's rows) and each
 * page's summaries. */
static bytes_w image(const kv_cache *kv)
{
    bytes_w w = { 0 };
    kv_save(kv, &w);
    int R = (int)kv_head_dim(kv);
    for (int il = 0; il < kv_n_layer(kv); il++)
        for (int hh = 0; hh < kv_n_head_kv(kv); hh++)
            for (int i = 0; i < kv_n_pages(kv, il, hh); i++) {
                const kv_page *p = kv_layer_page(kv, il, hh, i);
                bw_put(&w, p->ksum, sizeof(float) * (size_t)R);
                bw_put(&w, p->kmin, sizeof(float) * (size_t)R);
                bw_put(&w, p->kmax, sizeof(float) * (size_t)R);
            }
    bw_i64(&w, kv_len(kv));
    cr_assert(!w.err);
    return w;
}

/* An independent copy of kv (its own pages, through a snapshot). */
static kv_cache *copy_of(const kv_cache *kv, const int32_t *win)
{
    char err[256];
    kv_cache *c = kv_create(kv_n_layer(kv), kv_n_ctx(kv), kv_n_head_kv(kv), kv_head_dim(kv), kv_page_size(kv), win,
                            err, sizeof err);
    cr_assert(c, "%s", err);
    bytes_w w = { 0 };
    kv_save(kv, &w);
    bytes_r r = { w.p, w.n, 0, 0 };
    cr_assert(kv_load(c, &r, 1, err, sizeof err) == 0, "%s", err);
    bw_free(&w);
    return c;
}

static int same_image(const kv_cache *a, const kv_cache *b)
{
    bytes_w x = image(a), y = image(b);
    int same = x.n == y.n && !memcmp(x.p, y.p, x.n);
    bw_free(&x);
    bw_free(&y);
    return same;
}

/* One random change, the same to a cache and to its reference copy. */
static void change(kv_cache *c, kv_cache *ref, int H, int R, int round)
{
    enum { MAXN = 40 };
    static float k[MAXN * 2 * 16], v[MAXN * 2 * 16];
    static int64_t keep[8192];
    int what = (int)((rng >> 7) % 6);
    frand();
    int64_t len = kv_len(c);
    if (what <= 2 || len < 8) {   /* an append to both layers */
        int64_t n = 1 + (int64_t)((rng >> 21) % MAXN);
        for (int64_t i = 0; i < n * H * R; i++) k[i] = frand() * 2, v[i] = frand();
        for (int il = 0; il < 2; il++) {
            cr_assert(kv_append(c, il, k, v, n, len) == 0);
            cr_assert(kv_append(ref, il, k, v, n, len) == 0);
            kv_trim_window(c, il, len + n - 1, len);
            kv_trim_window(ref, il, len + n - 1, len);
        }
        kv_commit(c, len + n);
        kv_commit(ref, len + n);
    } else if (what == 3) {   /* a rewind, into the last page or further */
        int64_t to = len - 1 - (int64_t)((rng >> 19) % (uint64_t)(len < 20 ? len : 20));
        int64_t a = kv_rewind(c, to), b = kv_rewind(ref, to);
        cr_assert_eq(a, b, "round %d: rewound to %lld and %lld", round, (long long)a, (long long)b);
    } else if (what == 4) {   /* an eviction in the global layer's second head */
        int64_t n = kv_head_tokens(c, 1, 1), nk = 0;
        for (int64_t j = 0; j < n; j++)
            if (j < n / 2 || frand() > 0.3f) keep[nk++] = j;
        cr_assert(kv_keep_tokens(c, 1, 1, keep, nk) == 0);
        cr_assert(kv_keep_tokens(ref, 1, 1, keep, nk) == 0);
    } else {   /* the global layer cut short (a probe's rows taken back) */
        int64_t to = len - (int64_t)((rng >> 23) % 5);
        cr_assert(kv_truncate_layer(c, 1, to) == 0);
        cr_assert(kv_truncate_layer(ref, 1, to) == 0);
    }
}

Test(kvcache, a_fork_and_its_source_change_as_independent_copies_would)
{
    enum { H = 2, R = 16, P = 8 };
    const int32_t win[2] = { 12, 0 };   /* a sliding-window layer and a global one */
    char err[256];
    for (int order = 0; order < 2; order++) {
        kv_cache *a = kv_create(2, 4096, H, R, P, win, err, sizeof err);
        cr_assert(a, "%s", err);
        kv_cache *ra = copy_of(a, win);
        for (int round = 0; round < 30; round++) change(a, ra, H, R, round);
        kv_stats sa;
        kv_get_stats(a, &sa);
        kv_cache *b = kv_fork(a, err, sizeof err), *rb = copy_of(a, win), *d = NULL, *rd = NULL;
        cr_assert(b, "%s", err);
        cr_assert(same_image(b, a), "a fork holds what its source holds");
        kv_stats sb;
        kv_get_stats(b, &sb);
        cr_expect(sb.bytes_resident == sa.bytes_resident && sb.bytes_peak == sa.bytes_peak &&
                      sb.tokens_kept == sa.tokens_kept && sb.pages == sa.pages,
                  "a fork's figures are its source's: %llu bytes (its source %llu), peak %llu (%llu)",
                  (unsigned long long)sb.bytes_resident, (unsigned long long)sa.bytes_resident,
                  (unsigned long long)sb.bytes_peak, (unsigned long long)sa.bytes_peak);
        int shared = 0;
        for (int round = 0; round < 240; round++) {
            int who = (int)((rng >> 13) % 3);
            if (who == 0 && a) change(a, ra, H, R, round);
            if (who == 1) change(b, rb, H, R, round);
            if (who == 2 && d) change(d, rd, H, R, round);
            if (round == 60) {   /* a fork of the fork */
                d = kv_fork(b, err, sizeof err);
                cr_assert(d, "%s", err);
                rd = copy_of(b, win);
            }
            if (round == 120 + 60 * order && a) {   /* the source goes first (or late) */
                kv_free(a);
                kv_free(ra);
                a = ra = NULL;
            }
            if (a) cr_assert(same_image(a, ra), "round %d: the source is not what it would be alone", round);
            cr_assert(same_image(b, rb), "round %d: the fork is not what a copy would be", round);
            if (d) cr_assert(same_image(d, rd), "round %d: the fork's fork is not what a copy would be", round);
            for (int i = 0; a && i < kv_n_pages(b, 1, 0); i++)
                for (int j = 0; j < kv_n_pages(a, 1, 0); j++) shared += kv_layer_page(b, 1, 0, i) == kv_layer_page(a, 1, 0, j);
        }
        cr_expect(shared > 100, "the caches shared %d pages along the way", shared);
        /* every cache's figure counts the pages its tables hold, shared or not, as its copy's does */
        kv_stats st, sr;
        kv_get_stats(b, &st);
        kv_get_stats(rb, &sr);
        cr_expect(st.pages == sr.pages && st.bytes_resident - (uint64_t)st.pages * kv_page_bytes(b) < 65536,
                  "a fork's figure: %llu bytes for %lld pages", (unsigned long long)st.bytes_resident,
                  (long long)st.pages);
        if (order) {
            kv_free(b);
            kv_free(d);
        } else {
            kv_free(d);
            kv_free(b);
        }
        kv_free(a);
        kv_free(ra);
        kv_free(rb);
        kv_free(rd);
    }
}

/* ---- appends spread over threads (kv_append_on) */

static int same_figures(const kv_cache *a, const kv_cache *b)
{
    kv_stats x, y;
    kv_get_stats(a, &x);
    kv_get_stats(b, &y);
    for (int il = 0; il < kv_n_layer(a); il++)
        if (kv_peak_layer_tokens(a, il) != kv_peak_layer_tokens(b, il)) return 0;
    return x.bytes_resident == y.bytes_resident && x.bytes_peak == y.bytes_peak && x.tokens_kept == y.tokens_kept &&
           x.pages == y.pages && x.positions == y.positions;
}

/* Appends of 1 to 300 rows (past the size that spreads them, and below it) and evictions of a
 * layer's heads into a cache on four threads and into one on the calling thread, with rewinds into
 * a page (appends then start part-way into one) and a fork sharing the last pages (the append
 * copies them first): every row, position, summary and figure the same. */
Test(kvcache, appends_and_evictions_spread_over_threads_give_the_bytes_and_figures_of_one_thread)
{
    enum { L = 2, H = 3, R = 64, P = 16, MAXN = 300 };
    const int32_t win[L] = { 96, 0 };
    char err[256];
    be_backend *b = be_cpu_create(4, err, sizeof err);
    cr_assert(b, "%s", err);
    kv_cache *a = kv_create(L, 1 << 16, H, R, P, win, err, sizeof err), *r = kv_create(L, 1 << 16, H, R, P, win, err, sizeof err);
    cr_assert(a && r, "%s", err);
    kv_cache *fa = NULL, *fr = NULL;   /* a fork of each, appended to the same way */
    float *k = malloc(sizeof(float) * MAXN * H * R), *v = malloc(sizeof(float) * MAXN * H * R);
    int64_t *keep = malloc(sizeof(int64_t) * (1 << 16));
    cr_assert(k && v && keep);
    int spread = 0, spread_keep = 0;
    for (int round = 0; round < 160; round++) {
        int forked = round == 25 || round == 45;
        if (forked) {   /* then a large append first: into the shared last pages */
            kv_free(fa);
            kv_free(fr);
            fa = kv_fork(a, err, sizeof err);
            fr = kv_fork(r, err, sizeof err);
            cr_assert(fa && fr, "%s", err);
        }
        for (int who = 0; who < (fa ? 2 : 1); who++) {
            kv_cache *x = who ? fa : a, *y = who ? fr : r;
            int64_t len = kv_len(x);
            int what = forked ? 1 : (int)((rng >> 9) % 5);
            frand();
            if (what == 3 && len > 40) {   /* a rewind, usually into a page */
                int64_t to = len - 1 - (int64_t)((rng >> 17) % 37);
                cr_assert_eq(kv_rewind(x, to), kv_rewind(y, to));
                continue;
            }
            if (what == 4 && len > 40) {   /* an eviction in a layer's heads, some left alone */
                int il = (int)((rng >> 29) % L);
                for (int g = 0; g < H; g++) {
                    /* the first third kept whole (the table's first pages stay), or not (token 2
                     * dropped: every kept token is packed, which spreads exactly when it is large) */
                    int64_t n = kv_head_tokens(x, il, g), nk = 0;
                    const int whole = frand() > 0;
                    for (int64_t j = 0; j < n; j++)
                        if ((j < n / 3 && (whole || j != 2)) || frand() > -0.7f) keep[nk++] = j;
                    if (frand() < -0.5f) continue;
                    if (!whole && nk > 4 * P && nk * R >= 32768) spread_keep++;
                    cr_assert(kv_keep_tokens_on(x, b, il, g, keep, nk) == 0);
                    cr_assert(kv_keep_tokens(y, il, g, keep, nk) == 0);
                }
                cr_assert(same_image(x, y), "round %d: the spread eviction's rows, positions or summaries differ", round);
                cr_assert(same_figures(x, y), "round %d: the spread eviction's figures differ", round);
                continue;
            }
            int64_t n = what == 0 ? 1 + (int64_t)((rng >> 21) % 8) : 80 + (int64_t)((rng >> 21) % (MAXN - 80));
            if (n * H * R >= 16384) spread++;
            for (int64_t i = 0; i < n * H * R; i++) k[i] = frand() * 3, v[i] = frand();
            for (int il = 0; il < L; il++) {
                cr_assert(kv_append_on(x, b, il, k, v, n, len) == 0);
                cr_assert(kv_append(y, il, k, v, n, len) == 0);
                kv_trim_window(x, il, len + n - 1, len);
                kv_trim_window(y, il, len + n - 1, len);
            }
            kv_commit(x, len + n);
            kv_commit(y, len + n);
            cr_assert(same_image(x, y), "round %d (%s): the spread append's rows, positions or summaries differ", round,
                      who ? "the fork" : "the source");
            cr_assert(same_figures(x, y), "round %d (%s): the spread append's figures differ", round,
                      who ? "the fork" : "the source");
        }
    }
    cr_assert(spread > 20 && spread_keep > 8, "appends (%d) and evictions (%d) large enough to spread", spread,
              spread_keep);
    kv_free(fa);
    kv_free(fr);
    kv_free(a);
    kv_free(r);
    free(k);
    free(v);
    free(keep);
    be_free(b);
}
