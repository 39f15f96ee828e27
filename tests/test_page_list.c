/* A layer's lists kept from call to call (engine/page_list.h): after every change a decode, a rewind,
 * an eviction or a merge makes to the cache, the kept page_list, page_sums and page_spans equal
 * lists built afresh, entry by entry, and each page's summary is the fold of its rows that a device
 * computes from its copy of the page (bd_fold_elem). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kvcache.h"
#include "engine/page_list.h"
#include "kernels/bound_kernels.h"
#include "tests/fwd_fixture.h"

enum { LAYERS = 3, H = 3, D = 4, P = 4 };

static uint64_t next(uint64_t *r)
{
    *r = *r * 6364136223846793005ull + 1442695040888963407ull;
    return *r >> 33;
}

static void same_refs(const page_list *a, const page_list *b, int step, int il)
{
    for (int h = 0; h <= H; h++)
        cr_assert_eq(a->at.off[h], b->at.off[h], "step %d, layer %d: head %d's offset %lld, afresh %lld", step, il, h,
                     (long long)a->at.off[h], (long long)b->at.off[h]);
    for (int64_t e = 0; e < a->at.off[H]; e++) {
        const be_kv_page *x = &a->refs[e], *y = &b->refs[e];
        cr_assert(x->k == y->k && x->v == y->v && x->pos == y->pos && x->bias == y->bias && x->mask == y->mask &&
                      x->n == y->n && x->stride == y->stride && x->head_step == y->head_step && x->gen == y->gen &&
                      x->cap == y->cap && x->ksum == y->ksum,
                  "step %d, layer %d: entry %lld differs from the list built afresh (n %d and %d)", step, il,
                  (long long)e, x->n, y->n);
    }
}

static void same_sum(const be_summary *x, const be_summary *y, int step, int il, int64_t e)
{
    cr_assert(x->mn == y->mn && x->mx == y->mx && x->gen == y->gen && x->n == y->n,
              "step %d, layer %d: summary %lld differs from the one built afresh (n %lld and %lld)", step, il,
              (long long)e, (long long)x->n, (long long)y->n);
    cr_assert(x->k && x->k == y->k, "step %d, layer %d: summary %lld names other rows than the one built afresh", step, il,
              (long long)e);
    /* the summary is the fold of its page's rows, as a device folds it from its copy */
    float dev[2 * D];
    int64_t n_dev = -1;
    bd_fold f = { .k = x->k, .at = 0, .n = (int32_t)x->n, .runs = 1, .len = (int32_t)x->n };
    for (int64_t i = 0; i < D; i++) bd_fold_elem(&f, D, i, dev, &n_dev);
    cr_assert(!memcmp(dev, x->mn, sizeof(float) * D) && !memcmp(dev + D, x->mx, sizeof(float) * D) && n_dev == x->n,
              "step %d, layer %d: summary %lld is not the fold of its page's %lld rows", step, il, (long long)e,
              (long long)x->n);
}

/* Head by head (the room between the heads may differ: the kept list's grew over its history). */
static void same_sums(const page_sums *a, const page_sums *b, int step, int il)
{
    for (int h = 0; h < H; h++) {
        cr_assert_eq(a->at.end[h] - a->at.off[h], b->at.end[h] - b->at.off[h], "step %d, layer %d: head %d's summaries",
                     step, il, h);
        cr_assert(a->at.end[h] <= a->at.off[h + 1] && a->at.off[H] <= a->at.cap, "step %d: a head past its room", step);
    }
    for (int h = 0; h < H; h++)
        for (int64_t j = 0; j < a->at.end[h] - a->at.off[h]; j++)
            same_sum(&a->sums[a->at.off[h] + j], &b->sums[b->at.off[h] + j], step, il, a->at.off[h] + j);
}

/* Head by head, as same_sums. */
static void same_spans(const page_spans *a, const page_spans *b, int step, int il)
{
    for (int h = 0; h < H; h++) {
        int64_t n = a->at.end[h] - a->at.off[h];
        cr_assert_eq(n, b->at.end[h] - b->at.off[h], "step %d, layer %d: head %d's spans", step, il, h);
        cr_assert(a->at.end[h] <= a->at.off[h + 1] && a->at.off[H] <= a->at.cap, "step %d: a head past its room", step);
        int64_t j = 0;   /* the run of pages 0, 1, ... in order, as counted afresh */
        while (j < n && a->spans[a->at.off[h] + j].n > 0 && a->spans[a->at.off[h] + j].first / P == j &&
               a->spans[a->at.off[h] + j].last < (j + 1) * P)
            j++;
        cr_assert_eq(a->seq[h], j, "step %d, layer %d: head %d's run of pages in order", step, il, h);
        cr_assert_eq(b->seq[h], j);
        for (int64_t i = 0; i < n; i++) {
            const page_span *x = &a->spans[a->at.off[h] + i], *y = &b->spans[b->at.off[h] + i];
            cr_assert(x->first == y->first && x->last == y->last && x->n == y->n,
                      "step %d, layer %d: head %d's span %lld is %d..%d (%d), afresh %d..%d (%d)", step, il, h,
                      (long long)i, x->first, x->last, x->n, y->first, y->last, y->n);
        }
    }
}

/* Tokens of one head: every other one kept (an eviction), through kv_keep_tokens. */
static void evict_every_other(kv_cache *kv, int il, int h)
{
    int64_t n = kv_head_tokens(kv, il, h), m = 0;
    int64_t *keep = malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
    cr_assert(keep);
    for (int64_t t = 0; t < n; t += 2) keep[m++] = t;
    cr_assert(kv_keep_tokens(kv, il, h, keep, m) == 0);
    free(keep);
}

Test(page_list, the_kept_lists_equal_lists_built_afresh_after_every_change)
{
    char err[256];
    uint64_t r = 12345;
    kv_cache *kv = kv_create(LAYERS, 4096, H, D, P, NULL, err, sizeof err);
    cr_assert(kv, "%s", err);
    page_list kept[LAYERS] = { 0 };
    page_sums ksum[LAYERS] = { 0 };
    page_spans kspan[LAYERS] = { 0 };
    float k[H * D], v[H * D];
    for (int i = 0; i < H * D; i++) v[i] = 0;
    int kept_calls = 0, rebuilt = 0;
    for (int step = 0; step < 3000; step++) {
        uint64_t op = next(&r) % 100;
        int il = (int)(next(&r) % LAYERS), h = (int)(next(&r) % H);
        int64_t len = kv_len(kv);
        if (op < 55) {   /* a decode step or a prompt's chunk: rows to every head of every layer */
            fwd_fixture_random_keys(kv, LAYERS, 1 + (int64_t)(next(&r) % (op < 45 ? 2 : 11)), &r);
        } else if (op < 65) {   /* one head takes a row the others do not (heads of different lengths) */
            for (int i = 0; i < H * D; i++) k[i] = (float)(next(&r) % 64) / 16.0f - 2.0f;
            cr_assert(kv_append_head(kv, il, h, k, v, D, 1, len) == 0);
        } else if (op < 75 && len > 0) {   /* a rewind */
            kv_rewind(kv, len - 1 - (int64_t)(next(&r) % (len < 9 ? len : 9)));
        } else if (op < 82) {   /* pages dropped (a page eviction) */
            int np = kv_n_pages(kv, il, h), m = 0;
            int *keep = malloc(sizeof(int) * (size_t)(np > 0 ? np : 1));
            cr_assert(keep);
            for (int i = 0; i < np; i++)
                if (next(&r) % 3) keep[m++] = i;
            kv_keep_pages(kv, il, h, keep, m);
            free(keep);
        } else if (op < 88) {
            evict_every_other(kv, il, h);
        } else if (op < 92 && len > 0) {
            kv_truncate_layer(kv, il, len - 1 - (int64_t)(next(&r) % (len < 5 ? len : 5)));
        }
        if (kv_len(kv) > 3000) kv_rewind(kv, 0);
        for (int l = 0; l < LAYERS; l++) {
            /* Quest's counts: every page, or all but the last (its current page), now and then */
            int64_t count[H];
            for (int g = 0; g < H; g++) {
                int np = kv_n_pages(kv, l, g);
                count[g] = np - (np > 0 && next(&r) % 4 == 0);
            }
            int keeps = kept[l].at.shape == kv_layer_shape(kv, l);
            kept_calls += keeps;
            rebuilt += !keeps;
            cr_assert(page_list_update(&kept[l], kv, l) == 0);
            cr_assert(page_sums_update(&ksum[l], kv, l, count) == 0);
            cr_assert(page_spans_update(&kspan[l], kv, l) == 0);
            page_list fresh = { 0 };
            page_sums fsum = { 0 };
            page_spans fspan = { 0 };
            cr_assert(page_list_update(&fresh, kv, l) == 0);
            cr_assert(page_sums_update(&fsum, kv, l, count) == 0);
            cr_assert(page_spans_update(&fspan, kv, l) == 0);
            same_refs(&kept[l], &fresh, step, l);
            same_sums(&ksum[l], &fsum, step, l);
            same_spans(&kspan[l], &fspan, step, l);
            page_list_free(&fresh);
            page_sums_free(&fsum);
            page_spans_free(&fspan);
        }
    }
    /* both paths taken, the kept one most */
    cr_assert(kept_calls > 4000 && rebuilt > 500, "kept %d, rebuilt %d", kept_calls, rebuilt);
    for (int l = 0; l < LAYERS; l++) {
        page_list_free(&kept[l]);
        page_sums_free(&ksum[l]);
        page_spans_free(&kspan[l]);
    }
    kv_free(kv);
}

Test(page_list, more_heads_than_a_list_holds_is_an_error_that_leaves_it_empty)
{
    char err[256];
    uint64_t r = 7;
    kv_cache *kv = kv_create(1, 256, PAGE_LIST_MAX_HEADS + 1, 2, P, NULL, err, sizeof err);
    cr_assert(kv, "%s", err);
    fwd_fixture_random_keys(kv, 1, 9, &r);
    page_list L = { 0 };
    page_sums S = { 0 };
    int64_t count[PAGE_LIST_MAX_HEADS + 1] = { 0 };
    cr_assert(page_list_update(&L, kv, 0) == -1);
    cr_assert(page_sums_update(&S, kv, 0, count) == -1);
    cr_assert(L.at.shape == 0 && L.at.off[PAGE_LIST_MAX_HEADS] == 0 && S.at.shape == 0);
    page_list_free(&L);
    page_sums_free(&S);
    kv_free(kv);
}
