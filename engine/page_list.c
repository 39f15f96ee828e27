/* page_list.c - a layer's lists of its pages, kept from call to call (page_list.h). */
#include "engine/page_list.h"

#include <stdlib.h>
#include <string.h>

#include "common/bits.h"

void page_list_ref(be_kv_page *r, const kv_page *p, const uint64_t *mask, int head_dim, int page_size)
{
    r->k = p->k;
    r->v = p->v;
    r->pos = p->pos;
    r->bias = p->merged ? p->logdeg : NULL;
    r->mask = mask;
    r->n = p->n;
    r->stride = head_dim;
    r->head_step = 0;
    r->gen = p->gen;
    r->cap = page_size;
    r->ksum = p->ksum;
}

/* Room in *ent for count[h] entries of elem bytes a head of layer il (NULL: every page), placed by
 * at, side by side or (room) in regions of at->stride entries a head. Where the layer's shape is the
 * one the entries were written under and no head has fewer, they are kept (moved where the heads'
 * places changed: side by side, a head before them grew; with room, a head outgrew its region) and
 * first[h] is the first entry head h must write: its last one, whose page may have taken rows since,
 * and those after it. Else first[h] = 0. -1 when out of memory or past PAGE_LIST_MAX_HEADS heads, the
 * list then empty. cnt receives the counts. */
static int fit_heads(void **ent, size_t elem, page_heads *at, const kv_cache *kv, int il, const int64_t *count,
                     int room, int64_t *cnt, int64_t *first)
{
    int H = kv_n_head_kv(kv);
    uint64_t shape = kv_layer_shape(kv, il);
    if (H > PAGE_LIST_MAX_HEADS) goto fail;
    int64_t need = 0, most = 0;
    int keep = at->shape == shape;
    for (int h = 0; h < H; h++) {
        cnt[h] = count ? count[h] : kv_n_pages(kv, il, h);
        need += cnt[h];
        most = cnt[h] > most ? cnt[h] : most;
        if (cnt[h] < at->end[h] - at->off[h]) keep = 0;   /* cannot be while the shape holds */
    }
    int64_t stride = at->stride;
    if (room && most > stride) stride = most + most / 4 + 64;   /* a quarter more: moved once in many pages */
    if (room) need = stride * H;
    if (need > at->cap) {
        int64_t nc = room ? need : need * 2 > 64 ? need * 2 : 64;
        void *e = realloc(*ent, elem * (size_t)nc);   /* the entries stay */
        if (!e) goto fail;
        *ent = e;
        at->cap = nc;
    }
    int64_t no[PAGE_LIST_MAX_HEADS + 1];
    no[0] = 0;
    for (int h = 0; h < H; h++) no[h + 1] = room ? no[h] + stride : no[h] + cnt[h];
    char *base = *ent;
    for (int h = H - 1; keep && h >= 0; h--)   /* offsets only grow: the last head first, none overwritten */
        if (no[h] != at->off[h]) memmove(base + elem * (size_t)no[h], base + elem * (size_t)at->off[h],
                                         elem * (size_t)(at->end[h] - at->off[h]));
    for (int h = 0; h < H; h++) {
        int64_t had = at->end[h] - at->off[h];
        first[h] = keep && had > 0 ? had - 1 : 0;
        at->end[h] = no[h] + cnt[h];
    }
    memcpy(at->off, no, sizeof(int64_t) * (size_t)(H + 1));
    at->stride = room ? stride : 0;
    at->shape = shape;
    return 0;
fail:
    at->shape = 0;
    memset(at->off, 0, sizeof at->off);
    memset(at->end, 0, sizeof at->end);
    return -1;
}

/* An entry written for page p of a layer (at its place in the list). */
typedef void (*entry_fn)(void *entry, const kv_page *p, const kv_cache *kv);

/* The list brought up to date: fit_heads, then each head's entries from its first to write on,
 * written by fill. */
static int update_heads(void **ent, size_t elem, page_heads *at, const kv_cache *kv, int il, const int64_t *count,
                        int room, entry_fn fill, int64_t *first)
{
    int64_t cnt[PAGE_LIST_MAX_HEADS];
    if (fit_heads(ent, elem, at, kv, il, count, room, cnt, first)) return -1;
    char *base = *ent;
    for (int h = 0; h < kv_n_head_kv(kv); h++)
        for (int64_t j = first[h]; j < cnt[h]; j++)
            fill(base + elem * (size_t)(at->off[h] + j), kv_layer_page(kv, il, h, (int)j), kv);
    return 0;
}

static void fill_ref(void *e, const kv_page *p, const kv_cache *kv)
{
    page_list_ref(e, p, NULL, (int)kv_head_dim(kv), kv_page_size(kv));
}

/* The page's summary, and its key rows: a device holding a copy of the page folds it there. */
static void fill_sum(void *e, const kv_page *p, const kv_cache *kv)
{
    (void)kv;
    *(be_summary *)e = (be_summary){ .mn = p->kmin, .mx = p->kmax, .gen = p->gen, .n = p->n, .k = p->k };
}

static void fill_span(void *e, const kv_page *p, const kv_cache *kv)
{
    (void)kv;
    *(page_span *)e = p->n ? (page_span){ p->pos[0], p->pos[p->n - 1], p->n } : (page_span){ 0, -1, 0 };
}

int page_list_update(page_list *L, const kv_cache *kv, int il)
{
    void *ent = L->refs;
    int64_t first[PAGE_LIST_MAX_HEADS];
    int rc = update_heads(&ent, sizeof *L->refs, &L->at, kv, il, NULL, 0, fill_ref, first);
    L->refs = ent;
    return rc;
}

/* The entries a kept list's heads use: [0, the largest end). */
static int64_t used_entries(const page_heads *at)
{
    int64_t n = 0;
    for (int h = 0; h < PAGE_LIST_MAX_HEADS; h++) n = at->end[h] > n ? at->end[h] : n;
    return n;
}

/* *dst (cap entries of elem bytes, src's room) holding src's used entries. -1: out of memory. */
static int copy_entries(void **dst, const void *src, size_t elem, const page_heads *at)
{
    *dst = malloc(elem * (size_t)(at->cap > 0 ? at->cap : 1));
    if (!*dst) return -1;
    const int64_t n = used_entries(at);
    if (n > 0) memcpy(*dst, src, elem * (size_t)n);   /* a list of no pages may have no array */
    return 0;
}

int page_list_copy(page_list *dst, const page_list *src)
{
    memset(dst, 0, sizeof *dst);
    if (src->at.shape == 0) return 0;   /* nothing built */
    void *e;
    if (copy_entries(&e, src->refs, sizeof *src->refs, &src->at)) return -1;
    dst->refs = e;
    dst->at = src->at;
    return 0;
}

void page_list_free(page_list *L)
{
    free(L->refs);
    memset(L, 0, sizeof *L);
}

int page_sums_update(page_sums *L, const kv_cache *kv, int il, const int64_t *count)
{
    void *ent = L->sums;
    int64_t first[PAGE_LIST_MAX_HEADS];
    int rc = update_heads(&ent, sizeof *L->sums, &L->at, kv, il, count, 1, fill_sum, first);
    L->sums = ent;
    return rc;
}

void page_sums_free(page_sums *L)
{
    free(L->sums);
    memset(L, 0, sizeof *L);
}

int page_spans_update(page_spans *L, const kv_cache *kv, int il)
{
    void *ent = L->spans;
    int64_t first[PAGE_LIST_MAX_HEADS];
    int rc = update_heads(&ent, sizeof *L->spans, &L->at, kv, il, NULL, 1, fill_span, first);
    L->spans = ent;
    if (rc) {
        memset(L->seq, 0, sizeof L->seq);
        return rc;
    }
    const int64_t P = kv_page_size(kv);
    for (int h = 0; h < kv_n_head_kv(kv); h++) {
        /* the spans before first[h] are as they were: a run that ended before it stays so */
        if (L->seq[h] < first[h]) continue;
        const page_span *sp = L->spans + L->at.off[h];
        int64_t n = L->at.end[h] - L->at.off[h], j = first[h];
        while (j < n && sp[j].n > 0 && sp[j].first >= 0 && sp[j].first / P == j && sp[j].last < (j + 1) * P) j++;
        L->seq[h] = j;
    }
    return 0;
}

int page_spans_copy(page_spans *dst, const page_spans *src)
{
    memset(dst, 0, sizeof *dst);
    if (src->at.shape == 0) return 0;
    void *e;
    if (copy_entries(&e, src->spans, sizeof *src->spans, &src->at)) return -1;
    dst->spans = e;
    dst->at = src->at;
    memcpy(dst->seq, src->seq, sizeof dst->seq);
    return 0;
}

int page_spans_next_chosen(const page_span *span, int np, int i, const uint64_t *bm, int64_t words, int64_t *a)
{
    if ((*a = bm_next_bit(bm, words, *a)) < 0) return -1;
    while (i < np && (span[i].n == 0 || span[i].last < *a)) i++;
    if (i >= np) return -1;
    *a = (int64_t)span[i].last + 1;
    return i;
}

void page_spans_free(page_spans *L)
{
    free(L->spans);
    memset(L, 0, sizeof *L);
}

/* Room for n entries in L's list (the last one kept as it is). -1: out of memory. */
static int sel_room(sel_list *L, int64_t n)
{
    if (n <= L->cap) return 0;
    int64_t nc = n * 2 > 64 ? n * 2 : 64;
    be_kv_page *r = realloc(L->refs, sizeof *r * (size_t)nc);
    if (r) L->refs = r;
    int32_t *x = realloc(L->idx, sizeof *x * (size_t)nc);
    if (x) L->idx = x;
    int32_t *f = realloc(L->first, sizeof *f * (size_t)nc);
    if (f) L->first = f;
    if (!r || !x || !f) return -1;
    L->cap = nc;
    return 0;
}

static void sel_swap(sel_list *L)
{
    be_kv_page *r = L->refs;
    L->refs = L->old_refs;
    L->old_refs = r;
    int32_t *x = L->idx;
    L->idx = L->old_idx;
    L->old_idx = x;
    int32_t *f = L->first;
    L->first = L->old_first;
    L->old_first = f;
    int64_t c = L->cap;
    L->cap = L->old_cap;
    L->old_cap = c;
    memcpy(L->old_hp, L->hp, sizeof L->hp);
}

/* L emptied, nothing of the last list kept (a failed update). */
static int sel_fail(sel_list *L)
{
    memset(L->hp, 0, sizeof L->hp);
    memset(L->old_hp, 0, sizeof L->old_hp);
    L->layer_shape = 0;
    L->shape = kv_next_gen();
    return -1;
}

int sel_list_update(sel_list *L, const kv_cache *kv, int il, int per_head, const int64_t *off, const int *idx,
                    const uint64_t *const *mask)
{
    const int H = kv_n_head_kv(kv), D = (int)kv_head_dim(kv), P = kv_page_size(kv);
    if (H > PAGE_LIST_MAX_HEADS) return sel_fail(L);
    int64_t need = 0;
    for (int h = 0; h < H; h++) need += per_head ? off[h + 1] - off[h] : off[1];
    sel_swap(L);
    if (sel_room(L, need)) return sel_fail(L);
    const uint64_t layer = kv_layer_shape(kv, il);
    const int same_layer = L->layer_shape != 0 && L->layer_shape == layer;
    int grew = same_layer;   /* every head's list only grew at its end (the shape promise) */
    int64_t e = 0;
    for (int h = 0; h < H; h++) {
        const int np = kv_n_pages(kv, il, h);
        const int64_t s0 = per_head ? off[h] : 0, s1 = per_head ? off[h + 1] : off[1];
        const int64_t o0 = L->old_hp[h], o1 = L->old_hp[h + 1];
        int64_t o = o0;
        L->hp[h] = e;
        for (int64_t j = s0; j < s1; j++) {
            const int x = idx[j];
            if (x < 0 || x >= np) continue;   /* shared indices past a shorter head's table */
            const uint64_t *m = mask ? mask[j] : NULL;
            while (o < o1 && L->old_idx[o] < x) o++;
            if (same_layer && !m && o < o1 && L->old_idx[o] == x && x < L->np[h] - 1 && !L->old_refs[o].mask) {
                L->refs[e] = L->old_refs[o];   /* the same page, unchanged under the same shape */
                L->first[e] = L->old_first[o];
                L->copied++;
                if (o - o0 != e - L->hp[h]) grew = 0;   /* not in place: entries before it left or came */
            } else {
                const kv_page *p = kv_layer_page(kv, il, h, x);
                page_list_ref(&L->refs[e], p, m, D, P);
                L->first[e] = p->pos[0];   /* as the statistics read it (a page in a table holds rows) */
                L->read++;
                /* only the head's last entry then, or one past the end, may be built again */
                if (m || e - L->hp[h] < o1 - o0 - 1) grew = 0;
            }
            L->idx[e++] = x;
        }
        if (e - L->hp[h] < o1 - o0) grew = 0;   /* the head's list shrank */
        L->np[h] = np;
    }
    L->hp[H] = e;
    L->layer_shape = layer;
    if (!grew) L->shape = kv_next_gen();
    return 0;
}

void sel_list_free(sel_list *L)
{
    free(L->refs);
    free(L->idx);
    free(L->first);
    free(L->old_refs);
    free(L->old_idx);
    free(L->old_first);
    memset(L, 0, sizeof *L);
}
