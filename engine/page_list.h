/* page_list.h - a layer's lists of its pages as the backend's ops read them, kept from call to call:
 * page_list, every page's descriptor (be_kv_page) for attention and key_means; page_sums, the key
 * summaries (be_summary) of each head's first pages for a bounds call; page_spans, every page's
 * first and last position, for a policy that maps positions to pages.
 *
 * While the cache's layer shape (kv_layer_shape) stays the same, only each head's last page and the
 * pages after it are new, so an update rewrites a few entries a head instead of every page: the
 * host's work a decode step does not grow with the context, nor does it touch every page (at 8K
 * tokens on the 7B shape, 2,000 pages a layer whose headers are each a cache and TLB miss). The
 * forward pass keeps a page_list a layer for attention and a page_spans a global layer for the page
 * map of a step that attends every page and a sel_list a global layer for a policy's selection of
 * pages, CHESS a page_list a global layer for its summaries, Quest a page_sums a global layer for
 * its bounds, and SentKV and StreamingLLM a page_spans a global layer for their token masks. */
#ifndef KVCHAT_PAGE_LIST_H
#define KVCHAT_PAGE_LIST_H

#include <stdint.h>

#include "engine/kvcache.h"
#include "kernels/backend.h"

#define PAGE_LIST_MAX_HEADS 64

/* Where each kept list's entries are: head h's at [off[h], end[h]) of cap, written under the layer
 * shape `shape` (0: nothing built). A list with room between its heads (page_sums, for a bounds
 * call's be_bounds.end, and page_spans) keeps `stride` entries a head, so that a head's new pages
 * move nothing; a page_list's heads are side by side (end[h] = off[h + 1]), as be_attn reads them. */
typedef struct page_heads {
    int64_t cap, stride;
    int64_t off[PAGE_LIST_MAX_HEADS + 1];
    int64_t end[PAGE_LIST_MAX_HEADS];
    uint64_t shape;
} page_heads;

typedef struct page_list {
    be_kv_page *refs;
    page_heads at;
} page_list;

/* The descriptor of page p (mask NULL: every token) as the ops read it. */
void page_list_ref(be_kv_page *r, const kv_page *p, const uint64_t *mask, int head_dim, int page_size);
/* L brought up to date with layer il of kv: built whole when the layer's shape changed, else each
 * head's last page and those after it (the heads' entries moved up where a head gained pages). 0,
 * or -1 when out of memory (or more than PAGE_LIST_MAX_HEADS heads), L then empty. */
int page_list_update(page_list *L, const kv_cache *kv, int il);
/* dst (empty) made a copy of src, as kept of a cache that kv_fork then forked, so that the fork's
 * first update rewrites each head's last entries rather than building the list whole. 0, or -1
 * when out of memory (dst left empty: built whole at its first update). */
int page_list_copy(page_list *dst, const page_list *src);
void page_list_free(page_list *L);

typedef struct page_sums {
    be_summary *sums;
    page_heads at;
} page_sums;

/* L brought up to date with layer il of kv for the first count[h] pages of each head h (at most
 * kv_n_pages), entry j of head h being page j's { kmin, kmax, gen, n, k } (a device holding a copy
 * of the page folds the summary there), with room between the heads (page_heads): built whole when
 * the layer's shape changed or a head's count fell, else each head's last entry and those after it.
 * 0, or -1 when out of memory (or more than PAGE_LIST_MAX_HEADS heads), L then empty. */
int page_sums_update(page_sums *L, const kv_cache *kv, int il, const int64_t *count);
void page_sums_free(page_sums *L);

/* Where a page's tokens are: the positions of its first and last (first > last: empty) and their
 * count. The positions are consecutive when last - first + 1 == n. */
typedef struct page_span {
    int32_t first, last, n;
} page_span;

typedef struct page_spans {
    page_span *spans;
    page_heads at;
    /* head h's first seq[h] spans are pages 0 .. seq[h] - 1 of the sequence in order (span j holds
     * tokens, all of them at positions [j * P, (j + 1) * P): a cache no eviction touched), so a
     * reader that counts pages by their first position can take them as one run, and one that
     * keeps ranges of positions can find the pages they cover without looking at the others */
    int64_t seq[PAGE_LIST_MAX_HEADS];
} page_spans;

/* L brought up to date with every page of layer il of kv, as page_list_update but with room between
 * the heads (page_heads), seq with it (from the first span rewritten on). */
int page_spans_update(page_spans *L, const kv_cache *kv, int il);
/* dst (empty) made a copy of src, as page_list_copy. */
int page_spans_copy(page_spans *dst, const page_spans *src);
/* A walk over a head's pages span[0 .. np) to those that may hold a chosen position (a bit set in
 * bm, words long) without touching the pages: from page i on, the first that ends at or after the
 * next chosen position at or after *a (the pages passed over hold none), *a then moved past it; -1
 * when no chosen position or page is left. From i = 0 and *a = 0, then i + 1 after each. */
int page_spans_next_chosen(const page_span *span, int np, int i, const uint64_t *bm, int64_t words, int64_t *a);
void page_spans_free(page_spans *L);

/* A policy's selection of a layer's pages as attention reads it (entries of chosen pages, with
 * their token masks), kept from one decode step to the next: a selection that keeps most of its
 * pages from step to step (CHESS's) copies their entries from the last list instead of reading each
 * page again (at 32K on the 7B shape, thousands of pages' headers a step, each a cache miss). */
typedef struct sel_list {
    be_kv_page *refs;                 /* head h's entries at [hp[h], hp[h + 1]) */
    int32_t *idx, *first;             /* each entry's page index, and its page's first position */
    int64_t hp[PAGE_LIST_MAX_HEADS + 1];
    int64_t cap;
    be_kv_page *old_refs;             /* the list before the last update (its entries are copied) */
    int32_t *old_idx, *old_first;
    int64_t old_hp[PAGE_LIST_MAX_HEADS + 1];
    int64_t old_cap;
    int np[PAGE_LIST_MAX_HEADS];      /* each head's pages at the last update */
    uint64_t layer_shape;             /* the layer's shape then (kv_layer_shape; 0: none) */
    /* The list's own shape, as be_attn.shape promises it: the same as at the last update when
     * every head's list has since only grown at its end (the entries before its last one copied
     * in place, no token mask anywhere); new otherwise. */
    uint64_t shape;
    int64_t copied, read;             /* entries copied from the last list / built from their pages, so far */
} sel_list;

/* L brought to the selection of layer il of kv given as pol_sel gives it: per_head, head h's page
 * indices idx[off[h] .. off[h + 1]) (shared: idx[0 .. off[1]) for every head, those past a head's
 * pages left out), each with its token mask mask[j] (NULL: every token). An entry is copied from
 * the last list where that head listed the same page there, unmasked both times, the layer's shape
 * is unchanged and the page was not the head's last then (its rows may have grown since); else it
 * is built from the page (page_list_ref). 0, or -1 when out of memory (or more than
 * PAGE_LIST_MAX_HEADS heads), L then empty. */
int sel_list_update(sel_list *L, const kv_cache *kv, int il, int per_head, const int64_t *off, const int *idx,
                    const uint64_t *const *mask);
void sel_list_free(sel_list *L);

#endif
