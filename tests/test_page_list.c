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

/* L (and S, unless NULL) equal to layer l's lists built afresh of kv. */
static void same_as_afresh(const page_list *L, const page_spans *S, const kv_cache *kv, int l, int step)
{
    page_list fresh = { 0 };
    page_spans fspan = { 0 };
    cr_assert(page_list_update(&fresh, kv, l) == 0);
    same_refs(L, &fresh, step, l);
    if (S) {
        cr_assert(page_spans_update(&fspan, kv, l) == 0);
        same_spans(S, &fspan, step, l);
    }
    page_list_free(&fresh);
    page_spans_free(&fspan);
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

/* The cache changed as one random step of a history, by the shares `cut` gives (cumulative
 * percentages): rows to every head of every layer (cut[0]; below cut[1] one or two, else up to 11),
 * a row to one head (heads of different lengths), a rewind, pages dropped (a page eviction), every
 * other token of a head kept (a token eviction), a layer truncated; else nothing. */
typedef struct cache_ops { int rows, few_rows, one_head, rewind, drop_pages, keep_tokens, truncate; } cache_ops;

static void change_cache(kv_cache *kv, uint64_t *r, const cache_ops *cut)
{
    float k[H * D], v[H * D];
    for (int i = 0; i < H * D; i++) v[i] = 0;
    uint64_t op = next(r) % 100;
    int il = (int)(next(r) % LAYERS), h = (int)(next(r) % H);
    int64_t len = kv_len(kv);
    if (op < (uint64_t)cut->rows) {
        fwd_fixture_random_keys(kv, LAYERS, 1 + (int64_t)(next(r) % (op < (uint64_t)cut->few_rows ? 2 : 11)), r);
    } else if (op < (uint64_t)cut->one_head) {
        for (int i = 0; i < H * D; i++) k[i] = (float)(next(r) % 64) / 16.0f - 2.0f;
        cr_assert(kv_append_head(kv, il, h, k, v, D, 1, len) == 0);
    } else if (op < (uint64_t)cut->rewind && len > 0) {
        kv_rewind(kv, len - 1 - (int64_t)(next(r) % (len < 9 ? len : 9)));
    } else if (op < (uint64_t)cut->drop_pages) {
        int np = kv_n_pages(kv, il, h), m = 0;
        int *keep = malloc(sizeof(int) * (size_t)(np > 0 ? np : 1));
        cr_assert(keep);
        for (int i = 0; i < np; i++)
            if (next(r) % 3) keep[m++] = i;
        kv_keep_pages(kv, il, h, keep, m);
        free(keep);
    } else if (op < (uint64_t)cut->keep_tokens) {
        evict_every_other(kv, il, h);
    } else if (op < (uint64_t)cut->truncate && len > 0) {
        kv_truncate_layer(kv, il, len - 1 - (int64_t)(next(r) % (len < 5 ? len : 5)));
    }
    if (kv_len(kv) > 3000) kv_rewind(kv, 0);
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
    int kept_calls = 0, rebuilt = 0;
    static const cache_ops cut = { 55, 45, 65, 75, 82, 88, 92 };
    for (int step = 0; step < 3000; step++) {
        change_cache(kv, &r, &cut);
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
            page_sums fsum = { 0 };
            cr_assert(page_sums_update(&fsum, kv, l, count) == 0);
            same_as_afresh(&kept[l], &kspan[l], kv, l, step);
            same_sums(&ksum[l], &fsum, step, l);
            page_sums_free(&fsum);
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

/* A policy's selection kept from step to step (sel_list): after every change to the cache and to
 * the selection (the same pages again, the last page added, a page or two swapped, a new choice,
 * shared or per head, some masked), the list equals one built afresh from the pages, entry by
 * entry (with each page's first position), and where its shape stays the same, each head's
 * entries before its last one are those of the last list: the promise a device relies on to look
 * at each head's last entries only. */
Test(page_list, a_selection_kept_from_step_to_step_equals_one_built_afresh_and_keeps_its_promise)
{
    char err[256];
    uint64_t r = 99;
    kv_cache *kv = kv_create(LAYERS, 4096, H, D, P, NULL, err, sizeof err);
    cr_assert(kv, "%s", err);
    enum { MAXSEL = 1200 };
    static int idx[LAYERS][MAXSEL];
    static int64_t off[LAYERS][H + 1];
    static const uint64_t *mask[LAYERS][MAXSEL];
    static const uint64_t words[2] = { 0x5ull, 0xf0ull };
    int per_head[LAYERS] = { 0 };
    sel_list L[LAYERS];
    memset(L, 0, sizeof L);
    static be_kv_page prev[LAYERS][MAXSEL];
    int64_t prev_hp[LAYERS][H + 1];
    uint64_t prev_shape[LAYERS] = { 0 };
    int promised = 0, broken = 0;
    memset(off, 0, sizeof off);
    for (int step = 0; step < 3000; step++) {
        static const cache_ops cut = { 70, 60, 76, 82, 86, 89, 92 };
        if (next(&r) % 3 == 0) change_cache(kv, &r, &cut);
        else fwd_fixture_random_keys(kv, LAYERS, 1, &r);   /* a decode step */
        for (int l = 0; l < LAYERS; l++) {
            int np = 0;
            for (int g = 0; g < H; g++)
                if (kv_n_pages(kv, l, g) > np) np = kv_n_pages(kv, l, g);
            uint64_t how = next(&r) % 100;
            if (how >= 45 && how < 55 && off[l][1] > 2) {   /* a page of the first head's list dropped */
                int nh = per_head[l] ? H : 1;
                int64_t n = off[l][nh], j = (int64_t)(next(&r) % (uint64_t)(off[l][1] - 1));
                memmove(&idx[l][j], &idx[l][j + 1], sizeof(int) * (size_t)(n - j - 1));
                memmove(&mask[l][j], &mask[l][j + 1], sizeof mask[l][0] * (size_t)(n - j - 1));
                for (int q = 1; q <= nh; q++) off[l][q]--;
                how = 60;   /* and, where it is new, the last page added */
            }
            if (how >= 55 || off[l][per_head[l] ? H : 1] == 0) {   /* not the same pages again */
                if (how >= 90 || off[l][per_head[l] ? H : 1] == 0) {   /* a new choice */
                    per_head[l] = next(&r) % 3 == 0;
                    const int masked = next(&r) % 5 == 0;   /* a choice of tokens (SentKV's on the host) */
                    int64_t n = 0;
                    for (int g = 0; g < (per_head[l] ? H : 1); g++) {
                        off[l][g] = n;
                        for (int i = 0; i < np && n < MAXSEL / H; i++)
                            if (next(&r) % 3 == 0 || i == np - 1) {
                                idx[l][n] = i;
                                mask[l][n++] = masked && next(&r) % 2 ? &words[next(&r) % 2] : NULL;
                            }
                    }
                    off[l][per_head[l] ? H : 1] = n;
                } else if (how >= 75) {   /* a page swapped for another (the first head's list) */
                    int64_t n = off[l][1];
                    if (n > 1) {
                        int64_t j = (int64_t)(next(&r) % (uint64_t)(n - 1));
                        int lo = j > 0 ? idx[l][j - 1] + 1 : 0, hi = idx[l][j + 1];
                        if (hi > lo) idx[l][j] = lo + (int)(next(&r) % (uint64_t)(hi - lo));
                    }
                } else {   /* the last page added where it is new (a page opened) */
                    int nh = per_head[l] ? H : 1;
                    int64_t n = off[l][nh];
                    if (n < MAXSEL - H && np > 0 && idx[l][off[l][1] - 1] < np - 1) {
                        for (int g = nh - 1; g >= 0; g--) {   /* each head's list gets np - 1 at its end */
                            int64_t at = off[l][g + 1];
                            memmove(&idx[l][at + 1], &idx[l][at], sizeof(int) * (size_t)(n - at));
                            memmove(&mask[l][at + 1], &mask[l][at], sizeof mask[l][0] * (size_t)(n - at));
                            idx[l][at] = np - 1;
                            mask[l][at] = NULL;
                            n++;
                            for (int q = g + 1; q <= nh; q++) off[l][q]++;
                        }
                    }
                }
            }
            cr_assert(sel_list_update(&L[l], kv, l, per_head[l], off[l], idx[l], (const uint64_t *const *)mask[l]) == 0);
            /* afresh */
            int64_t e = 0;
            for (int g = 0; g < H; g++) {
                cr_assert_eq(L[l].hp[g], e, "step %d, layer %d: head %d's offset", step, l, g);
                int ng = kv_n_pages(kv, l, g);
                int64_t s0 = per_head[l] ? off[l][g] : 0, s1 = per_head[l] ? off[l][g + 1] : off[l][1];
                for (int64_t j = s0; j < s1; j++) {
                    if (idx[l][j] >= ng) continue;
                    const kv_page *p = kv_layer_page(kv, l, g, idx[l][j]);
                    be_kv_page want;
                    page_list_ref(&want, p, mask[l][j], D, P);
                    const be_kv_page *x = &L[l].refs[e];
                    cr_assert(x->k == want.k && x->v == want.v && x->pos == want.pos && x->bias == want.bias &&
                                  x->mask == want.mask && x->n == want.n && x->gen == want.gen && x->cap == want.cap &&
                                  x->stride == want.stride && x->ksum == want.ksum,
                              "step %d, layer %d, head %d: entry %lld is not its page's", step, l, g, (long long)e);
                    cr_assert_eq(L[l].first[e], p->pos[0]);
                    cr_assert_eq(L[l].idx[e], idx[l][j]);
                    e++;
                }
            }
            cr_assert_eq(L[l].hp[H], e);
            /* the promise, against the last list */
            if (L[l].shape == prev_shape[l]) {
                promised++;
                for (int g = 0; g < H; g++) {
                    int64_t was = prev_hp[l][g + 1] - prev_hp[l][g], now = L[l].hp[g + 1] - L[l].hp[g];
                    cr_assert_geq(now, was, "step %d, layer %d: head %d shrank under one shape", step, l, g);
                    for (int64_t j = 0; j + 1 < was; j++) {
                        const be_kv_page *a = &L[l].refs[L[l].hp[g] + j], *b = &prev[l][prev_hp[l][g] + j];
                        cr_assert(!a->mask && a->k == b->k && a->gen == b->gen && a->n == b->n && a->pos == b->pos &&
                                      a->bias == b->bias,
                                  "step %d, layer %d, head %d: entry %lld changed under one shape", step, l, g, (long long)j);
                    }
                }
            } else {
                broken++;
            }
            prev_shape[l] = L[l].shape;
            memcpy(prev_hp[l], L[l].hp, sizeof prev_hp[l]);
            memcpy(prev[l], L[l].refs, sizeof(be_kv_page) * (size_t)L[l].hp[H]);
        }
    }
    int64_t copied = 0, read = 0;
    for (int l = 0; l < LAYERS; l++) {
        copied += L[l].copied;
        read += L[l].read;
        sel_list_free(&L[l]);
    }
    cr_expect(copied > 2 * read, "entries copied %lld, read %lld", (long long)copied, (long long)read);
    cr_log_info("the shape kept %d times, new %d times; entries copied %lld, read %lld", promised, broken, (long long)copied, (long long)read);
    cr_expect(promised > 3000 && broken > 1000, "the shape kept %d times, new %d times", promised, broken);
    kv_free(kv);
}

/* A fork's lists start as copies of its source's (page_list_copy, page_spans_copy): kv_fork gives
 * its tables the source's shapes, and copying a shared last page keeps a layer's shape in both, so
 * after each cache appends (the first to append copying the shared last pages), each list's update
 * rewrites only its heads' last entries (an entry before them, spoiled on purpose, stays spoiled)
 * and then equals a list built afresh of its own cache. */
Test(page_list, a_forks_lists_start_as_its_sources_and_keep_up_with_its_own_pages)
{
    char err[256];
    uint64_t r = 5;
    kv_cache *kv = kv_create(LAYERS, 4096, H, D, P, NULL, err, sizeof err);
    cr_assert(kv, "%s", err);
    page_list src[LAYERS] = { 0 }, fork[LAYERS] = { 0 };
    page_spans ssrc[LAYERS] = { 0 }, sfork[LAYERS] = { 0 };
    /* lists of a layer of no pages (built, with no array) copy as lists of no pages */
    cr_assert(page_list_update(&src[0], kv, 0) == 0 && page_spans_update(&ssrc[0], kv, 0) == 0);
    cr_assert(page_list_copy(&fork[0], &src[0]) == 0 && page_spans_copy(&sfork[0], &ssrc[0]) == 0);
    cr_assert(fork[0].at.shape == src[0].at.shape && fork[0].at.off[H] == 0);
    page_list_free(&src[0]);
    page_list_free(&fork[0]);
    page_spans_free(&ssrc[0]);
    page_spans_free(&sfork[0]);
    fwd_fixture_random_keys(kv, LAYERS, 4 * P + 2, &r);   /* each head's last page part-filled */
    for (int l = 0; l < LAYERS; l++) {
        cr_assert(page_list_update(&src[l], kv, l) == 0);
        cr_assert(page_spans_update(&ssrc[l], kv, l) == 0);
    }
    kv_cache *fk = kv_fork(kv, err, sizeof err);
    cr_assert(fk, "%s", err);
    uint64_t shape[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        shape[l] = kv_layer_shape(kv, l);
        cr_assert_eq(kv_layer_shape(fk, l), shape[l], "layer %d: the fork has another shape", l);
        cr_assert(page_list_copy(&fork[l], &src[l]) == 0);
        cr_assert(page_spans_copy(&sfork[l], &ssrc[l]) == 0);
    }
    for (int round = 0; round < 2 * P; round++) {
        fwd_fixture_random_keys(fk, LAYERS, 1, &r);   /* the fork copies the shared last pages; the source then owns them */
        fwd_fixture_random_keys(kv, LAYERS, 1 + (int64_t)(next(&r) % 2), &r);
        for (int l = 0; l < LAYERS; l++) {
            cr_assert_eq(kv_layer_shape(fk, l), shape[l], "round %d, layer %d: the fork's shape changed", round, l);
            cr_assert_eq(kv_layer_shape(kv, l), shape[l], "round %d, layer %d: the source's shape changed", round, l);
            if (round == 0) {   /* spoil an entry before the last: an update that only appends leaves it */
                fork[l].refs[0].cap = -7;
                sfork[l].spans[0].n = -7;
            }
            cr_assert(page_list_update(&fork[l], fk, l) == 0);
            cr_assert(page_spans_update(&sfork[l], fk, l) == 0);
            cr_assert(page_list_update(&src[l], kv, l) == 0);
            if (round == 0) {
                cr_assert_eq(fork[l].refs[0].cap, -7, "layer %d: the fork's list was built whole", l);
                cr_assert_eq(sfork[l].spans[0].n, -7, "layer %d: the fork's spans were built whole", l);
                fork[l].refs[0].cap = P;
                sfork[l].spans[0].n = P;
            }
            same_as_afresh(&fork[l], &sfork[l], fk, l, round);
            same_as_afresh(&src[l], NULL, kv, l, round);
        }
    }
    for (int l = 0; l < LAYERS; l++) {
        page_list_free(&src[l]);
        page_list_free(&fork[l]);
        page_spans_free(&ssrc[l]);
        page_spans_free(&sfork[l]);
    }
    kv_free(fk);
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
