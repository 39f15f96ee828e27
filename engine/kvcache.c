/* kvcache.c - paged K/V storage with per-page summaries (see kvcache.h).
 *
 * A page is one allocation: K and V rows, positions, log-degrees and the three summary vectors.
 * Freed pages stay on a short free list for reuse (a decode step that crosses a page boundary would
 * otherwise call malloc on every layer); the list is capped so eviction gives memory back. */
#include "engine/kvcache.h"

#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/bytes.h"
#include "engine/page_list.h"
#include "kernels/backend.h"

#define FREE_LIST_MAX 64

/* The page table of one KV head of one layer. */
typedef struct kv_stream {
    kv_page **pages;
    int n, cap;
    int64_t tokens;
} kv_stream;

typedef struct kv_layer {
    kv_stream *heads;      /* [n_head_kv] */
    int32_t window;
    int64_t peak_tokens;   /* most tokens any of its heads has held */
    uint64_t shape;        /* kv_layer_shape: new whenever a table changes other than by appends */
} kv_layer;

struct kv_cache {
    int n_layer;
    int page_size;
    int64_t n_ctx;
    int n_head_kv;
    int64_t row_dim;       /* head_dim: a page holds one KV head's rows */
    int64_t len;
    int64_t floor;
    int64_t mark;             /* second protected rewind target (-1: none) */
    kv_layer *layers;
    kv_page **free_list;
    int n_free;
    uint64_t page_bytes;
    uint64_t bytes;        /* pages in use + page tables */
    uint64_t peak;
    be_page_move *moves;   /* an eviction's runs, named to a device backend (name_moves) */
    int64_t cap_moves;
    be_page_move *cow;     /* an append's copies of shared pages, named likewise (own_page) */
    int n_cow, cap_cow;
};


static void account(kv_cache *kv, int64_t delta)
{
    kv->bytes = (uint64_t)((int64_t)kv->bytes + delta);
    if (kv->bytes > kv->peak) kv->peak = kv->bytes;
}

kv_cache *kv_create(int n_layer, int64_t n_ctx, int n_head_kv, int64_t head_dim, int page_size, const int32_t *window,
                    char *err, size_t errlen)
{
    int64_t row_dim = head_dim;
    if (n_layer <= 0 || n_ctx <= 0 || n_head_kv <= 0 || row_dim <= 0 || page_size < 1 || page_size > 4096) {
        snprintf(err, errlen, "invalid KV cache shape (layers %d, context %lld, KV heads %d, head %lld, page %d)",
                 n_layer, (long long)n_ctx, n_head_kv, (long long)row_dim, page_size);
        return NULL;
    }
    kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv) goto oom;
    kv->n_layer = n_layer;
    kv->mark = -1;
    kv->page_size = page_size;
    kv->n_ctx = n_ctx;
    kv->row_dim = row_dim;
    kv->n_head_kv = n_head_kv;
    kv->layers = calloc((size_t)n_layer, sizeof *kv->layers);
    kv->free_list = calloc(FREE_LIST_MAX, sizeof *kv->free_list);
    if (!kv->layers || !kv->free_list) goto oom;
    for (int il = 0; il < n_layer; il++) {
        kv->layers[il].window = window ? window[il] : 0;
        kv->layers[il].shape = kv_next_gen();
        kv->layers[il].heads = calloc((size_t)n_head_kv, sizeof(kv_stream));
        if (!kv->layers[il].heads) goto oom;
    }
    size_t P = (size_t)page_size, R = (size_t)row_dim;
    kv->page_bytes = sizeof(kv_page) + 2 * P * R * sizeof(uint16_t) + P * (sizeof(int32_t) + sizeof(float)) +
                     3 * R * sizeof(float);
    return kv;
oom:
    kv_free(kv);
    snprintf(err, errlen, "out of memory creating the KV cache");
    return NULL;
}

void kv_free(kv_cache *kv)
{
    if (!kv) return;
    if (kv->layers) {
        for (int il = 0; il < kv->n_layer; il++) {
            if (!kv->layers[il].heads) continue;
            for (int h = 0; h < kv->n_head_kv; h++) {
                kv_stream *S = &kv->layers[il].heads[h];
                for (int i = 0; i < S->n; i++) {
                    kv_page *p = S->pages[i];
                    if (p->holders > 1) p->holders--;   /* another cache still holds it: it goes with that one */
                    else free(p);
                }
                free(S->pages);
            }
            free(kv->layers[il].heads);
        }
    }
    for (int i = 0; i < kv->n_free; i++) free(kv->free_list[i]);
    free(kv->free_list);
    free(kv->moves);
    free(kv->cow);
    free(kv->layers);
    free(kv);
}

int kv_n_layer(const kv_cache *kv) { return kv->n_layer; }
int kv_page_size(const kv_cache *kv) { return kv->page_size; }
int kv_n_head_kv(const kv_cache *kv) { return kv->n_head_kv; }
int64_t kv_head_dim(const kv_cache *kv) { return kv->row_dim; }
int64_t kv_n_ctx(const kv_cache *kv) { return kv->n_ctx; }
int32_t kv_window(const kv_cache *kv, int il) { return kv->layers[il].window; }
int64_t kv_len(const kv_cache *kv) { return kv->len; }
int kv_n_pages(const kv_cache *kv, int il, int h) { return kv->layers[il].heads[h].n; }
kv_page *kv_layer_page(const kv_cache *kv, int il, int h, int i) { return kv->layers[il].heads[h].pages[i]; }
int64_t kv_head_tokens(const kv_cache *kv, int il, int h) { return kv->layers[il].heads[h].tokens; }
int kv_next_row_opens_page(const kv_cache *kv, int il, int h)
{
    const kv_stream *L = &kv->layers[il].heads[h];
    return L->n == 0 || L->pages[L->n - 1]->n == kv->page_size;   /* as kv_append_head decides */
}
uint64_t kv_page_bytes(const kv_cache *kv) { return kv->page_bytes; }
void kv_set_floor(kv_cache *kv, int64_t pos) { kv->floor = pos; }
void kv_set_mark(kv_cache *kv, int64_t pos) { kv->mark = pos; }

uint64_t kv_next_gen(void)
{
    static _Atomic uint64_t counter;
    return ++counter;
}

uint64_t kv_layer_shape(const kv_cache *kv, int il) { return kv->layers[il].shape; }

static void reshape(kv_cache *kv, int il) { kv->layers[il].shape = kv_next_gen(); }

static void page_reset(const kv_cache *kv, kv_page *p)
{
    p->n = 0;
    p->gen = kv_next_gen();
    p->merged = 0;
    for (int64_t i = 0; i < kv->row_dim; i++) {
        p->ksum[i] = 0;
        p->kmin[i] = FLT_MAX;
        p->kmax[i] = -FLT_MAX;
    }
}

kv_page *kv_page_new(kv_cache *kv)
{
    kv_page *p;
    if (kv->n_free > 0) {
        p = kv->free_list[--kv->n_free];
        account(kv, (int64_t)kv->page_bytes);
    } else {
        p = malloc(kv->page_bytes);
        if (!p) return NULL;
        account(kv, (int64_t)kv->page_bytes);
        size_t P = (size_t)kv->page_size, R = (size_t)kv->row_dim;
        char *c = (char *)(p + 1);
        /* summaries first: floats stay 4-byte aligned whatever P and R are */
        p->ksum = (float *)c;
        p->kmin = p->ksum + R;
        p->kmax = p->kmin + R;
        p->logdeg = p->kmax + R;
        p->pos = (int32_t *)(p->logdeg + P);
        p->k = (uint16_t *)(p->pos + P);
        p->v = p->k + P * R;
    }
    page_reset(kv, p);
    p->holders = 1;
    return p;
}

static void page_release(kv_cache *kv, kv_page *p)
{
    account(kv, -(int64_t)kv->page_bytes);
    if (p->holders > 1) {   /* another cache still holds it (kv_fork): it stays */
        p->holders--;
        return;
    }
    if (kv->n_free < FREE_LIST_MAX) {
        kv->free_list[kv->n_free++] = p;   /* kept for reuse: counted in bytes_pooled, not as held */
        return;
    }
    free(p);
}

/* Add p after the last page of head h's table (what appending does: the shape stays). */
static int push_page(kv_cache *kv, int il, int h, kv_page *p)
{
    kv_stream *L = &kv->layers[il].heads[h];
    if (L->n == L->cap) {
        int nc = L->cap ? L->cap * 2 : 64;
        kv_page **np = realloc(L->pages, sizeof *np * (size_t)nc);
        if (!np) return -1;
        account(kv, (int64_t)sizeof *np * (nc - L->cap));
        L->pages = np;
        L->cap = nc;
    }
    L->pages[L->n++] = p;
    L->tokens += p->n;
    return 0;
}

int kv_push_page(kv_cache *kv, int il, int h, kv_page *p)
{
    reshape(kv, il);   /* a page of any content, from a policy that rebuilds the table */
    return push_page(kv, il, h, p);
}

kv_cache *kv_fork(const kv_cache *src, char *err, size_t errlen)
{
    int32_t *win = malloc(sizeof(int32_t) * (size_t)src->n_layer);
    if (!win) {
        snprintf(err, errlen, "out of memory forking the KV cache");
        return NULL;
    }
    for (int il = 0; il < src->n_layer; il++) win[il] = src->layers[il].window;
    kv_cache *kv = kv_create(src->n_layer, src->n_ctx, src->n_head_kv, src->row_dim, src->page_size, win, err, errlen);
    free(win);
    if (!kv) return NULL;
    kv->len = src->len;
    kv->floor = src->floor;
    kv->mark = src->mark;
    for (int il = 0; il < src->n_layer; il++) {
        kv->layers[il].peak_tokens = src->layers[il].peak_tokens;
        for (int h = 0; h < src->n_head_kv; h++) {
            const kv_stream *S = &src->layers[il].heads[h];
            for (int i = 0; i < S->n; i++) {
                if (push_page(kv, il, h, S->pages[i])) {
                    kv_free(kv);
                    snprintf(err, errlen, "out of memory forking the KV cache");
                    return NULL;
                }
                S->pages[i]->holders++;
                account(kv, (int64_t)kv->page_bytes);   /* held here too: the figures of a copy */
            }
        }
    }
    for (int il = 0; il < src->n_layer; il++)   /* the same tables: lists kept of the source's hold for the fork */
        kv->layers[il].shape = src->layers[il].shape;
    kv->peak = src->peak > kv->bytes ? src->peak : kv->bytes;
    return kv;
}

/* A copy own_page made of page p for a device backend that builds its copy of the copy from its
 * copy of p (be_ops.page_moves), instead of receiving it whole at the next call that reads it: a
 * fork's first append copies each head's shared last page (at 32K on the 7B shape, 8 forks' first
 * steps copied 2,048 pages a step, 32 MiB sent up). Held in kv->cow until send_cow; a page with
 * merged tokens is left to be sent whole (its biases), as an eviction's is. */
static void name_cow(kv_cache *kv, be_backend *b, const kv_page *c, const kv_page *p)
{
    if (!b || !b->ops->page_moves || p->merged || p->n <= 0) return;
    if (kv->n_cow == kv->cap_cow) {
        int nc = kv->cap_cow ? 2 * kv->cap_cow : 16;
        be_page_move *nm = realloc(kv->cow, sizeof *nm * (size_t)nc);
        if (!nm) return;   /* sent whole instead */
        kv->cow = nm;
        kv->cap_cow = nc;
    }
    be_page_move *e = &kv->cow[kv->n_cow++];
    page_list_ref(&e->dst, c, NULL, (int)kv->row_dim, kv->page_size);   /* its rows as copied, before any append */
    page_list_ref(&e->src, p, NULL, (int)kv->row_dim, kv->page_size);
    e->dst_row = e->src_row = 0;
    e->n = p->n;
}

/* The copies named since the last send, to b (while their sources are held: within the append). */
static void send_cow(kv_cache *kv, be_backend *b)
{
    if (kv->n_cow) b->ops->page_moves(b, kv->cow, kv->n_cow);
    kv->n_cow = 0;
}

/* The last page of head h's table (the only page a cache writes in place: appends, a truncation),
 * this cache's alone before it changes: a page a fork shares is copied (rows, positions,
 * log-degrees, summaries) into one of its own first (named to b, if not NULL: name_cow). The copy
 * takes the place of the table's last page with the same rows, so the layer keeps its shape
 * (kv_layer_shape): whoever keeps lists of the table rewrites its last entry anyway, and the copy's
 * new generation tells a device it is another page. NULL when out of memory (the table is
 * unchanged). */
static kv_page *own_page(kv_cache *kv, be_backend *b, int il, int h)
{
    kv_stream *L = &kv->layers[il].heads[h];
    const int i = L->n - 1;
    kv_page *p = L->pages[i];
    if (p->holders == 1) return p;
    /* the copy takes the shared page's place in this cache's figures (no peak of both) */
    account(kv, -(int64_t)kv->page_bytes);
    kv_page *c = kv_page_new(kv);
    if (!c) {
        account(kv, (int64_t)kv->page_bytes);
        return NULL;
    }
    size_t R = (size_t)kv->row_dim, n = (size_t)p->n;
    memcpy(c->k, p->k, n * R * sizeof(uint16_t));
    memcpy(c->v, p->v, n * R * sizeof(uint16_t));
    memcpy(c->pos, p->pos, n * sizeof(int32_t));
    memcpy(c->logdeg, p->logdeg, n * sizeof(float));
    memcpy(c->ksum, p->ksum, R * sizeof(float));
    memcpy(c->kmin, p->kmin, R * sizeof(float));
    memcpy(c->kmax, p->kmax, R * sizeof(float));
    c->n = p->n;
    c->merged = p->merged;
    L->pages[i] = c;
    name_cow(kv, b, c, p);
    p->holders--;   /* another cache still holds it; this one no longer counts it */
    return c;
}

/* Fold one f16 key row into the page summaries (the CPU's vector kernel: a 7B prefill folds 67
 * million keys per 2,048 tokens, which one element at a time took half a second of its host time). */
/* The page's summary folded with its rows [from, p->n), in order. */
static void summarize_rows(const kv_cache *kv, kv_page *p, int32_t from)
{
    if (p->n > from)
        be_host_key_summary_rows(kv->row_dim, p->n - from, p->k + (size_t)from * (size_t)kv->row_dim, kv->row_dim,
                                 p->ksum, p->kmin, p->kmax);
}

void kv_page_resummarize(const kv_cache *kv, kv_page *p)
{
    int32_t n = p->n;
    int merged = 0;
    p->gen = kv_next_gen();   /* a device's copies of its rows and summaries are stale */
    for (int64_t i = 0; i < kv->row_dim; i++) {
        p->ksum[i] = 0;
        p->kmin[i] = FLT_MAX;
        p->kmax[i] = -FLT_MAX;
    }
    summarize_rows(kv, p, 0);
    for (int32_t t = 0; t < n; t++)
        if (p->logdeg[t] != 0) merged = 1;
    p->merged = merged;
}

/* Rows [from, from + run) of page p: key and value rows t, t + stride, ... converted to f16, their
 * positions from pos0, no log-degree, folded into the page's summary. */
static void fill_rows(const kv_cache *kv, kv_page *p, int32_t from, int32_t run, const float *k, const float *v,
                      int64_t stride, int64_t pos0)
{
    size_t R = (size_t)kv->row_dim;
    uint16_t *kr = p->k + (size_t)from * R, *vr = p->v + (size_t)from * R;
    if ((size_t)stride == R) {
        be_host_f32_to_f16((int64_t)R * run, k, kr);
        be_host_f32_to_f16((int64_t)R * run, v, vr);
    } else {
        for (int32_t i = 0; i < run; i++) {
            be_host_f32_to_f16((int64_t)R, k + (size_t)i * (size_t)stride, kr + (size_t)i * R);
            be_host_f32_to_f16((int64_t)R, v + (size_t)i * (size_t)stride, vr + (size_t)i * R);
        }
    }
    for (int32_t i = 0; i < run; i++) {
        p->pos[from + i] = (int32_t)(pos0 + i);
        p->logdeg[from + i] = 0;
    }
    p->n = from + run;
    summarize_rows(kv, p, from);
}

static int append_head(kv_cache *kv, be_backend *b, int il, int h, const float *k, const float *v, int64_t stride,
                       int64_t n, int64_t p0);

/* kv_append, the shared pages it copies named to b (NULL: none). */
static int append_rows(kv_cache *kv, be_backend *b, int il, const float *k, const float *v, int64_t n, int64_t p0)
{
    int rc = 0;
    for (int h = 0; h < kv->n_head_kv && !rc; h++)
        rc = append_head(kv, b, il, h, k + (size_t)h * (size_t)kv->row_dim, v + (size_t)h * (size_t)kv->row_dim,
                         (int64_t)kv->n_head_kv * kv->row_dim, n, p0);
    if (b) send_cow(kv, b);
    return rc;
}

int kv_append(kv_cache *kv, int il, const float *k, const float *v, int64_t n, int64_t p0)
{
    return append_rows(kv, NULL, il, k, v, n, p0);
}

/* Below this many values an append stays on the calling thread (a decode step's row: waking the
 * threads would cost more than the work). */
#define APPEND_SPREAD_MIN 16384

/* One page's share of a spread append: rows [from, from + run) of p are the input's rows t .. of
 * KV head h. */
typedef struct append_task {
    kv_page *p;
    int64_t t;
    int32_t from, run;
    int h;
} append_task;

typedef struct append_job {
    const kv_cache *kv;
    const float *k, *v;
    int64_t p0;
    const append_task *tasks;
} append_job;

static void append_task_run(void *ctx, int64_t i, int thread)
{
    (void)thread;
    const append_job *j = ctx;
    const append_task *a = &j->tasks[i];
    size_t R = (size_t)j->kv->row_dim, stride = (size_t)j->kv->n_head_kv * R;
    size_t off = (size_t)a->t * stride + (size_t)a->h * R;
    fill_rows(j->kv, a->p, a->from, a->run, j->k + off, j->v + off, (int64_t)stride, j->p0 + a->t);
}

int kv_append_on(kv_cache *kv, be_backend *b, int il, const float *k, const float *v, int64_t n, int64_t p0)
{
    const int H = kv->n_head_kv, P = kv->page_size;
    if (!b || n <= 0 || n * H * kv->row_dim < APPEND_SPREAD_MIN) return append_rows(kv, b, il, k, v, n, p0);
    int64_t cap = (int64_t)H * (n / P + 2);
    append_task *tasks = malloc(sizeof *tasks * (size_t)cap);
    int *kept = malloc(sizeof *kept * (size_t)H);
    if (!tasks || !kept) {
        free(tasks);
        free(kept);
        return kv_append(kv, il, k, v, n, p0);
    }
    /* Every page the rows go into, made ready here on this thread (the pool, the figures and the
     * tables are not shared): the last page where it has room (this cache's own copy), then fresh
     * pages. */
    int64_t nt = 0;
    int h = 0, rc = 0;
    for (; h < H; h++) {
        kv_stream *L = &kv->layers[il].heads[h];
        int64_t t = 0;
        kept[h] = L->n;
        kv_page *p = L->n ? L->pages[L->n - 1] : NULL;
        if (p && p->n < P) {
            if (!(p = own_page(kv, b, il, h))) break;   /* a copy in the shared page's place */
            int32_t run = P - p->n < n ? P - p->n : (int32_t)n;
            tasks[nt++] = (append_task){ p, 0, p->n, run, h };
            t = run;
        }
        for (; t < n; t += P) {
            if (!(p = kv_page_new(kv))) break;
            if (push_page(kv, il, h, p)) {
                page_release(kv, p);
                break;
            }
            tasks[nt++] = (append_task){ p, t, 0, P < n - t ? P : (int32_t)(n - t), h };
        }
        if (t < n) break;
    }
    send_cow(kv, b);   /* the copies stay in the tables either way; their rows as copied */
    if (h < H) {   /* out of memory: the fresh pages go back, the table as it was */
        for (int g = 0; g <= h; g++) {
            kv_stream *L = &kv->layers[il].heads[g];
            while (L->n > kept[g]) page_release(kv, L->pages[--L->n]);
        }
        reshape(kv, il);
        rc = -1;
    } else {
        append_job job = { kv, k, v, p0, tasks };
        be_host_run(b, append_task_run, &job, nt);
        for (h = 0; h < H; h++) {
            kv_stream *L = &kv->layers[il].heads[h];
            L->tokens += n;
            if (L->tokens > kv->layers[il].peak_tokens) kv->layers[il].peak_tokens = L->tokens;
        }
    }
    free(tasks);
    free(kept);
    return rc;
}

int kv_append_head(kv_cache *kv, int il, int h, const float *k, const float *v, int64_t stride, int64_t n, int64_t p0)
{
    return append_head(kv, NULL, il, h, k, v, stride, n, p0);
}

static int append_head(kv_cache *kv, be_backend *b, int il, int h, const float *k, const float *v, int64_t stride,
                       int64_t n, int64_t p0)
{
    kv_stream *L = &kv->layers[il].heads[h];
    for (int64_t t = 0; t < n;) {   /* the rows that go into the table's last page, at a time */
        kv_page *p = L->n ? L->pages[L->n - 1] : NULL;
        if (p && p->n < kv->page_size && !(p = own_page(kv, b, il, h))) return -1;
        if (!p || p->n == kv->page_size) {
            p = kv_page_new(kv);
            if (!p || push_page(kv, il, h, p) != 0) {
                if (p) page_release(kv, p);
                return -1;
            }
        }
        int32_t from = p->n, run = kv->page_size - from < n - t ? kv->page_size - from : (int32_t)(n - t);
        fill_rows(kv, p, from, run, k + (size_t)t * (size_t)stride, v + (size_t)t * (size_t)stride, stride, p0 + t);
        L->tokens += run;
        if (L->tokens > kv->layers[il].peak_tokens) kv->layers[il].peak_tokens = L->tokens;
        t += run;
    }
    return 0;
}

void kv_commit(kv_cache *kv, int64_t len) { kv->len = len; }

/* Remove every token at position >= pos from layer il (tokens are in position order within a
 * layer's table, so only the tail is touched). */
static int stream_truncate(kv_cache *kv, int il, int h, int64_t pos)
{
    kv_stream *L = &kv->layers[il].heads[h];
    while (L->n > 0) {
        kv_page *p = L->pages[L->n - 1];
        int32_t keep = p->n;
        while (keep > 0 && p->pos[keep - 1] >= pos) keep--;
        if (keep == p->n) break;
        reshape(kv, il);
        L->tokens -= p->n - keep;
        if (keep == 0) {
            L->n--;
            page_release(kv, p);
            continue;
        }
        kv_page *own = own_page(kv, NULL, il, h);
        if (!own) {   /* a shared page, and no memory to copy it: the caller starts again from 0 */
            L->tokens += p->n - keep;
            return -1;
        }
        p = own;
        p->n = keep;
        kv_page_resummarize(kv, p);   /* a new generation: the rows past keep will be written again */
        break;
    }
    return 0;
}

int64_t kv_peak_layer_tokens(const kv_cache *kv, int il) { return kv->layers[il].peak_tokens; }

int kv_truncate_layer(kv_cache *kv, int il, int64_t pos)
{
    int bad = 0;
    for (int h = 0; h < kv->n_head_kv; h++) bad |= stream_truncate(kv, il, h, pos);
    return bad ? -1 : 0;
}

/* Every table emptied (what a rewind falls back to). */
static void clear_all(kv_cache *kv)
{
    for (int il = 0; il < kv->n_layer; il++)
        for (int h = 0; h < kv->n_head_kv; h++) stream_truncate(kv, il, h, 0);   /* releases: cannot fail */
    kv->len = 0;
}

/* Tokens of one head's table with positions in [lo, hi). */
static int64_t stream_count_range(const kv_stream *L, int64_t lo, int64_t hi)
{
    int64_t c = 0;
    for (int i = 0; i < L->n; i++) {
        const kv_page *p = L->pages[i];
        if (p->n == 0 || p->pos[p->n - 1] < lo || p->pos[0] >= hi) continue;
        for (int32_t t = 0; t < p->n; t++) c += p->pos[t] >= lo && p->pos[t] < hi;
    }
    return c;
}

int64_t kv_rewind(kv_cache *kv, int64_t pos)
{
    if (pos >= kv->len) {
        /* nothing committed to forget, but a chunk that stopped part-way (cancelled, failed) left
         * its tokens in the layers it reached */
        int bad = 0;
        for (int il = 0; il < kv->n_layer; il++)
            for (int h = 0; h < kv->n_head_kv; h++) bad |= stream_truncate(kv, il, h, pos);
        if (!bad) return kv->len;
        clear_all(kv);
        return 0;
    }
    if (pos < 0) pos = 0;
    int exact = 1;
    for (int il = 0; il < kv->n_layer && exact; il++) {
        int64_t w = kv->layers[il].window;
        if (w <= 0 || pos == 0) continue;
        int64_t lo = pos - w + 1 > 0 ? pos - w + 1 : 0;
        for (int h = 0; h < kv->n_head_kv; h++)
            if (stream_count_range(&kv->layers[il].heads[h], lo, pos) != pos - lo) exact = 0;
    }
    if (!exact) pos = 0;
    int bad = 0;
    for (int il = 0; il < kv->n_layer; il++)
        for (int h = 0; h < kv->n_head_kv; h++) bad |= stream_truncate(kv, il, h, pos);
    if (bad) {
        clear_all(kv);
        return 0;
    }
    kv->len = pos;
    return pos;
}

/* Does a page with positions [first, last] hold keys that a query (or a rewind target) at r sees? */
static int needed_by(int64_t first, int64_t last, int64_t r, int64_t w)
{
    return last >= r - w + 1 && first <= r - 1;
}

void kv_trim_window(kv_cache *kv, int il, int64_t q_min, int64_t eval_start)
{
    int64_t w = kv->layers[il].window;
    if (w <= 0) return;
    for (int h = 0; h < kv->n_head_kv; h++) {
    kv_stream *L = &kv->layers[il].heads[h];
    if (L->n <= 1) continue;
    int out = 0;
    for (int i = 0; i < L->n; i++) {
        kv_page *p = L->pages[i];
        int64_t first = p->pos[0], last = p->pos[p->n - 1];
        int keep = i == L->n - 1 || last >= q_min - w + 1 || needed_by(first, last, kv->floor, w) ||
                   (kv->mark >= 0 && needed_by(first, last, kv->mark, w)) ||
                   needed_by(first, last, eval_start, w);
        if (keep) {
            L->pages[out++] = p;
        } else {
            L->tokens -= p->n;
            page_release(kv, p);
        }
    }
    if (out != L->n) reshape(kv, il);
    L->n = out;
    }
}

void kv_keep_pages(kv_cache *kv, int il, int h, const int *keep, int n_keep)
{
    kv_stream *L = &kv->layers[il].heads[h];
    reshape(kv, il);
    int j = 0, out = 0;
    for (int i = 0; i < L->n; i++) {
        kv_page *p = L->pages[i];
        if (j < n_keep && keep[j] == i) {
            L->pages[out++] = p;
            j++;
        } else {
            L->tokens -= p->n;
            page_release(kv, p);
        }
    }
    L->n = out;
}

/* n fresh pages, or NULL (nothing allocated) when out of memory. */
static kv_page **new_pages(kv_cache *kv, int n)
{
    kv_page **np = malloc(sizeof *np * (size_t)(n > 0 ? n : 1));
    if (!np) return NULL;
    for (int i = 0; i < n; i++) {
        np[i] = kv_page_new(kv);
        if (!np[i]) {
            for (int j = 0; j < i; j++) page_release(kv, np[j]);
            free(np);
            return NULL;
        }
    }
    return np;
}

/* Head h of layer il keeps its first `from` pages and gets the non-empty pages of np (which is
 * freed) instead of the others. */
static void replace_table_from(kv_cache *kv, int il, int h, int from, kv_page **np, int n)
{
    kv_stream *L = &kv->layers[il].heads[h];
    reshape(kv, il);
    for (int i = from; i < L->n; i++) {
        L->tokens -= L->pages[i]->n;
        page_release(kv, L->pages[i]);
    }
    L->n = from;
    for (int i = 0; i < n; i++)   /* cannot fail: n is at most the pages the table held before */
        if (np[i]->n == 0 || push_page(kv, il, h, np[i]) != 0) page_release(kv, np[i]);
    free(np);
}


/* Where head h's kept tokens go: its first pages, full and kept whole, stay as they are (packing
 * would write them again as they are; their content generations too, so a device's copies of them
 * stay current): *same of them; the rest into *n_new fresh pages *np. Keep is ascending, so
 * keep[x] == x says every token up to x is kept. 0, or -1 when out of memory. */
static int keep_plan(kv_cache *kv, int il, int h, const int64_t *keep, int64_t n_keep, int *same_out, kv_page ***np,
                     int *n_new)
{
    const kv_stream *L = &kv->layers[il].heads[h];
    int P = kv->page_size, same = 0;
    while (same < L->n && L->pages[same]->n == P && (int64_t)(same + 1) * P <= n_keep &&
           keep[(int64_t)(same + 1) * P - 1] == (int64_t)(same + 1) * P - 1)
        same++;
    *same_out = same;
    *n_new = (int)((n_keep - (int64_t)same * P + P - 1) / P);
    *np = new_pages(kv, *n_new);
    return *np ? 0 : -1;
}

/* A walk over the runs of kept tokens from kept slot j on (slot j0 + x is the x-th token past
 * the table's first `same` pages that goes into the fresh pages): each run is consecutive tokens of
 * one page of L that go into one fresh page. What keep_fill copies and name_moves names. */
typedef struct keep_walk {
    const kv_stream *L;
    const int64_t *keep;
    int64_t j, end, src_base;   /* the next slot, the slot to stop at, the table index of pages[src_page]'s first */
    int src_page, P;
} keep_walk;

static keep_walk walk_from(const kv_stream *L, int same, int P, const int64_t *keep, int64_t j, int64_t end)
{
    return (keep_walk){ L, keep, j, end, (int64_t)same * P, same, P };
}

/* The next run: slots [*j, *j + *run) are rows [*t, *t + *run) of *sp. 0 when the walk is over (at
 * its end, or at an index past the table's end, whose rest is ignored). */
static int walk_next(keep_walk *w, const kv_page **sp, int32_t *t, int32_t *run, int64_t *j)
{
    if (w->j >= w->end) return 0;
    const int64_t idx = w->keep[w->j];
    const kv_stream *L = w->L;
    while (w->src_page < L->n && idx >= w->src_base + L->pages[w->src_page]->n)
        w->src_base += L->pages[w->src_page++]->n;
    if (w->src_page >= L->n) return 0;
    *sp = L->pages[w->src_page];
    *t = (int32_t)(idx - w->src_base);
    *j = w->j;
    int32_t r = 1;
    while (w->j + r < w->end && w->keep[w->j + r] == idx + r && *t + r < (*sp)->n && (w->j + r) % w->P != 0) r++;
    *run = r;
    w->j += r;
    return 1;
}

/* The kept tokens of L past its first `same` pages that go into fresh pages np[i0 .. i1) (page i
 * takes kept tokens j0 + i P .., j0 = same P) copied there, with their summaries. Reads L's pages,
 * writes only those of np. */
static void keep_fill(const kv_cache *kv, const kv_stream *L, int same, const int64_t *keep, int64_t n_keep,
                      kv_page **np, int i0, int i1)
{
    size_t R = (size_t)kv->row_dim;
    int P = kv->page_size;
    const int64_t j0 = (int64_t)same * P, end = j0 + (int64_t)i1 * P < n_keep ? j0 + (int64_t)i1 * P : n_keep;
    keep_walk w = walk_from(L, same, P, keep, j0 + (int64_t)i0 * P, end);
    const kv_page *sp;
    int32_t t, run;
    int64_t j;
    while (walk_next(&w, &sp, &t, &run, &j)) {
        kv_page *dp = np[(j - j0) / P];
        memcpy(dp->k + (size_t)dp->n * R, sp->k + (size_t)t * R, (size_t)run * R * sizeof(uint16_t));
        memcpy(dp->v + (size_t)dp->n * R, sp->v + (size_t)t * R, (size_t)run * R * sizeof(uint16_t));
        memcpy(dp->pos + dp->n, sp->pos + t, (size_t)run * sizeof(int32_t));
        memcpy(dp->logdeg + dp->n, sp->logdeg + t, (size_t)run * sizeof(float));
        for (int32_t i = 0; i < run; i++)
            if (sp->logdeg[t + i] != 0) dp->merged = 1;
        dp->n += run;
    }
    for (int i = i0; i < i1; i++) summarize_rows(kv, np[i], 0);   /* each new page's rows at once */
}

/* Fresh pages a task of a spread eviction fills (a few, so that a wake-up's cost stays small), and
 * the fewest kept values (tokens x head dimension) that are spread at all. */
#define KEEP_TASK_PAGES 4
#define KEEP_SPREAD_MIN 32768

typedef struct keep_job {
    const kv_cache *kv;
    const kv_stream *L;
    int same, n_new;
    const int64_t *keep;
    int64_t n_keep;
    kv_page **np;
} keep_job;

static void keep_task_run(void *ctx, int64_t i, int thread)
{
    (void)thread;
    const keep_job *j = ctx;
    int i0 = (int)i * KEEP_TASK_PAGES, i1 = i0 + KEEP_TASK_PAGES < j->n_new ? i0 + KEEP_TASK_PAGES : j->n_new;
    keep_fill(j->kv, j->L, j->same, j->keep, j->n_keep, j->np, i0, i1);
}

/* The runs keep_fill copied into the fresh pages np, named to a device backend that builds its
 * copies of them from its copies of the table's pages (be_ops.page_moves), before those pages go.
 * A fresh page holding merged tokens is left to be sent whole (its biases); so is everything when
 * the host is out of memory for the list. */
static void name_moves(kv_cache *kv, be_backend *b, const kv_stream *L, int same, const int64_t *keep,
                       int64_t n_keep, kv_page **np)
{
    const int P = kv->page_size, R = (int)kv->row_dim;
    const int64_t j0 = (int64_t)same * P;
    if (n_keep - j0 > kv->cap_moves) {
        be_page_move *nm = realloc(kv->moves, sizeof *nm * (size_t)(n_keep - j0));
        if (!nm) return;
        kv->moves = nm;
        kv->cap_moves = n_keep - j0;
    }
    int m = 0;
    keep_walk w = walk_from(L, same, P, keep, j0, n_keep);   /* keep_fill's runs */
    const kv_page *sp;
    int32_t t, run;
    int64_t j;
    while (walk_next(&w, &sp, &t, &run, &j)) {
        const kv_page *dp = np[(j - j0) / P];
        if (dp->merged) continue;
        be_page_move *e = &kv->moves[m++];
        page_list_ref(&e->dst, dp, NULL, R, P);
        page_list_ref(&e->src, sp, NULL, R, P);
        e->dst_row = (int32_t)((j - j0) % P);
        e->src_row = t;
        e->n = run;
    }
    if (m) b->ops->page_moves(b, kv->moves, m);
}

int kv_keep_tokens_on(kv_cache *kv, struct be_backend *b, int il, int h, const int64_t *keep, int64_t n_keep)
{
    int same, n_new;
    kv_page **np;
    if (keep_plan(kv, il, h, keep, n_keep, &same, &np, &n_new)) return -1;
    keep_job job = { kv, &kv->layers[il].heads[h], same, n_new, keep, n_keep, np };
    /* one task when the head's copying is too small to gain from threads */
    int64_t tasks = !b || (n_keep - (int64_t)same * kv->page_size) * kv->row_dim < KEEP_SPREAD_MIN
                        ? 1 : (n_new + KEEP_TASK_PAGES - 1) / KEEP_TASK_PAGES;
    if (tasks == 1) keep_fill(kv, job.L, same, keep, n_keep, np, 0, n_new);
    else be_host_run(b, keep_task_run, &job, tasks);
    if (b && b->ops->page_moves) name_moves(kv, b, job.L, same, keep, n_keep, np);
    replace_table_from(kv, il, h, same, np, n_new);
    return 0;
}

int kv_keep_tokens(kv_cache *kv, int il, int h, const int64_t *keep, int64_t n_keep)
{
    return kv_keep_tokens_on(kv, NULL, il, h, keep, n_keep);
}

void kv_reset_peak(kv_cache *kv)
{
    kv->peak = kv->bytes;
    for (int il = 0; il < kv->n_layer; il++) {
        int64_t mx = 0;
        for (int h = 0; h < kv->n_head_kv; h++)
            if (kv->layers[il].heads[h].tokens > mx) mx = kv->layers[il].heads[h].tokens;
        kv->layers[il].peak_tokens = mx;
    }
}

int kv_rebuild_head(kv_cache *kv, int il, int h, const float *k, const float *v, const int32_t *pos,
                    const float *logdeg, int64_t n)
{
    size_t R = (size_t)kv->row_dim;
    int P = kv->page_size;
    int n_new = (int)((n + P - 1) / P);
    kv_page **np = new_pages(kv, n_new);
    if (!np) return -1;
    for (int64_t j = 0; j < n; j++) {
        kv_page *dp = np[j / P];
        uint16_t *kr = dp->k + (size_t)dp->n * R;
        be_host_f32_to_f16((int64_t)R, k + (size_t)j * R, kr);
        be_host_f32_to_f16((int64_t)R, v + (size_t)j * R, dp->v + (size_t)dp->n * R);
        dp->pos[dp->n] = pos[j];
        dp->logdeg[dp->n] = logdeg ? logdeg[j] : 0.0f;
        if (dp->logdeg[dp->n] != 0) dp->merged = 1;
        dp->n++;
    }
    for (int i = 0; i < n_new; i++) summarize_rows(kv, np[i], 0);
    replace_table_from(kv, il, h, 0, np, n_new);
    return 0;
}

void kv_get_stats(const kv_cache *kv, kv_stats *st)
{
    memset(st, 0, sizeof *st);
    st->positions = kv->len;
    for (int il = 0; il < kv->n_layer; il++) {
        for (int h = 0; h < kv->n_head_kv; h++) {
            st->tokens_kept += kv->layers[il].heads[h].tokens;
            st->pages += kv->layers[il].heads[h].n;
        }
    }
    st->tokens_full = kv->len * kv->n_layer * kv->n_head_kv;
    st->bytes_resident = kv->bytes;
    st->bytes_full = (uint64_t)st->tokens_full * (uint64_t)kv->row_dim * 2u * sizeof(uint16_t);
    st->bytes_peak = kv->peak;
    st->bytes_pooled = (uint64_t)kv->n_free * kv->page_bytes;
}

/* ------------------------------------------------------------------------------ snapshots */

void kv_save(const kv_cache *kv, bytes_w *w)
{
    size_t R = (size_t)kv->row_dim;
    bw_u32(w, (uint32_t)kv->n_layer);
    bw_u32(w, (uint32_t)kv->n_head_kv);
    bw_i64(w, kv->row_dim);
    bw_u32(w, (uint32_t)kv->page_size);
    bw_i64(w, kv->len);
    bw_i64(w, kv->floor);
    for (int il = 0; il < kv->n_layer; il++) {
        const kv_layer *L = &kv->layers[il];
        bw_u32(w, (uint32_t)L->window);
        bw_i64(w, L->peak_tokens);
        for (int h = 0; h < kv->n_head_kv; h++) {
            const kv_stream *S = &L->heads[h];
            bw_u32(w, (uint32_t)S->n);
            for (int i = 0; i < S->n; i++) {
                const kv_page *p = S->pages[i];
                bw_u32(w, (uint32_t)p->n);
                bw_put(w, p->pos, sizeof(int32_t) * (size_t)p->n);
                bw_put(w, p->logdeg, sizeof(float) * (size_t)p->n);
                bw_put(w, p->k, sizeof(uint16_t) * (size_t)p->n * R);
                bw_put(w, p->v, sizeof(uint16_t) * (size_t)p->n * R);
            }
        }
    }
}

/* 1 when none of n f16 values (read unaligned) is an infinity or a NaN: a cache never holds one, and
 * one in attention would make every logit NaN. */
static int halves_finite(const uint16_t *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, b + 2 * i, sizeof h);
        if ((h & 0x7c00u) == 0x7c00u) return 0;
    }
    return 1;
}

int kv_load(kv_cache *kv, bytes_r *r, int apply, char *err, size_t errlen)
{
    size_t R = (size_t)kv->row_dim;
    uint32_t nl = br_u32(r), nh = br_u32(r);
    int64_t rd = br_i64(r);
    uint32_t P = br_u32(r);
    int64_t len = br_i64(r), floor = br_i64(r);
    if (r->err) goto truncated;
    if ((int)nl != kv->n_layer || (int)nh != kv->n_head_kv || rd != kv->row_dim || (int)P != kv->page_size) {
        snprintf(err, errlen, "the snapshot's cache is %u layers x %u KV heads x %lld dims in pages of %u, this one "
                 "%d x %d x %lld in pages of %d", nl, nh, (long long)rd, P, kv->n_layer, kv->n_head_kv,
                 (long long)kv->row_dim, kv->page_size);
        return -1;
    }
    if (len < 0 || len > kv->n_ctx) {
        snprintf(err, errlen, "the snapshot holds %lld positions, more than the context of %lld", (long long)len,
                 (long long)kv->n_ctx);
        return -1;
    }
    if (floor < -1 || floor > len) {
        snprintf(err, errlen, "the snapshot's rewind floor %lld is outside its %lld positions", (long long)floor,
                 (long long)len);
        return -1;
    }
    if (apply) {
        for (int il = 0; il < kv->n_layer; il++)
            for (int h = 0; h < kv->n_head_kv; h++) stream_truncate(kv, il, h, 0);   /* releases only */
        kv->len = len;
        kv->floor = floor;
        kv->mark = -1;
    }
    for (int il = 0; il < kv->n_layer; il++) {
        int32_t window = (int32_t)br_u32(r);
        int64_t peak = br_i64(r);
        if (r->err) goto truncated;
        if (peak < 0 || peak > kv->n_ctx + kv->page_size) {
            snprintf(err, errlen, "the snapshot's layer %d has a peak of %lld tokens", il, (long long)peak);
            return -1;
        }
        if (window != kv->layers[il].window) {
            snprintf(err, errlen, "the snapshot's layer %d has a window of %d tokens, this model's %d", il, window,
                     kv->layers[il].window);
            return -1;
        }
        if (apply) kv->layers[il].peak_tokens = peak;
        for (int h = 0; h < kv->n_head_kv; h++) {
            uint32_t np = br_u32(r);
            if (r->err) goto truncated;
            if ((int64_t)np > len) {
                snprintf(err, errlen, "the snapshot's layer %d head %d has %u pages for %lld positions", il, h, np,
                         (long long)len);
                return -1;
            }
            int64_t last = -1;
            for (uint32_t i = 0; i < np; i++) {
                uint32_t n = br_u32(r);
                if (r->err) goto truncated;
                if (n == 0 || n > P) {
                    snprintf(err, errlen, "the snapshot has a page of %u tokens (pages hold 1 to %u)", n, P);
                    return -1;
                }
                const int32_t *pos = br_view(r, sizeof(int32_t) * n);
                const float *ld = br_view(r, sizeof(float) * n);
                const uint16_t *k = br_view(r, sizeof(uint16_t) * n * R), *v = br_view(r, sizeof(uint16_t) * n * R);
                if (r->err) goto truncated;
                for (uint32_t t = 0; t < n; t++) {
                    int32_t ps;
                    float d;
                    memcpy(&ps, pos + t, sizeof ps);   /* the bytes need not be aligned */
                    memcpy(&d, ld + t, sizeof d);
                    if (ps <= last || ps >= len || !(d >= 0 && d < 64)) {
                        snprintf(err, errlen, "the snapshot's layer %d head %d has a bad token (position %d, "
                                 "log-degree %g)", il, h, ps, (double)d);
                        return -1;
                    }
                    last = ps;
                }
                if (!halves_finite(k, n * R) || !halves_finite(v, n * R)) {
                    snprintf(err, errlen, "the snapshot's layer %d head %d has a key or value that is not a finite "
                             "number", il, h);
                    return -1;
                }
                if (!apply) continue;
                kv_page *p = kv_page_new(kv);
                if (!p || kv_push_page(kv, il, h, p) != 0) {
                    if (p) page_release(kv, p);
                    snprintf(err, errlen, "out of memory restoring the snapshot's cache");
                    return -1;
                }
                memcpy(p->pos, pos, sizeof(int32_t) * n);
                memcpy(p->logdeg, ld, sizeof(float) * n);
                memcpy(p->k, k, sizeof(uint16_t) * n * R);
                memcpy(p->v, v, sizeof(uint16_t) * n * R);
                p->n = (int32_t)n;
                kv_page_resummarize(kv, p);
                kv->layers[il].heads[h].tokens += n;
            }
        }
    }
    return 0;
truncated:
    snprintf(err, errlen, "the snapshot's cache section is truncated");
    return -1;
}
