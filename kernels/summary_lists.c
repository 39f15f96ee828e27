/* summary_lists.c - the selection policies' summaries kept on the device (see summary_lists.h). */
#include "kernels/summary_lists.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/bound_kernels.h"

void sl_init(sl_table *t, const sl_device *dev, ub_batch *batch)
{
    memset(t, 0, sizeof *t);
    t->dev = *dev;
    t->batch = batch;
}

static void drop(sl_table *t, sl_list *L)
{
    if (L->dev) {
        t->dev.release(t->dev.ud, L->dev);
        t->bytes -= sizeof(float) * (uint64_t)(L->n_heads * L->cap * 2 * L->dim);
    }
    if (L->dev_n) {
        t->dev.release(t->dev.ud, L->dev_n);
        t->bytes -= sizeof(int64_t) * (uint64_t)(L->n_heads * L->cap);
    }
    free(L->seen);
    memset(L, 0, sizeof *L);
}

void sl_free(sl_table *t)
{
    for (int i = 0; i < t->n_lists; i++) drop(t, &t->lists[i]);
    free(t->lists);
    free(t->ns);
    free(t->folds);
    t->lists = NULL;
    t->ns = NULL;
    t->folds = NULL;
    t->n_lists = 0;
    t->cap_ns = 0;
    t->n_folds = t->cap_folds = 0;
}

void sl_forget(sl_table *t)
{
    t->n_folds = 0;
    for (int i = 0; i < t->n_lists; i++) {
        sl_list *L = &t->lists[i];
        if (L->seen) memset(L->seen, 0, sizeof *L->seen * (size_t)(L->n_heads * L->cap));
        L->shape = 0;
    }
}

/* The slot named name, or a free one (made when none is left); NULL when out of host memory. */
static sl_list *find(sl_table *t, uint64_t name)
{
    sl_list *free_slot = NULL;
    for (int i = 0; i < t->n_lists; i++) {
        if (t->lists[i].name == name) return &t->lists[i];
        if (!t->lists[i].name && !free_slot) free_slot = &t->lists[i];
    }
    if (free_slot) return free_slot;
    int n = t->n_lists ? t->n_lists * 2 : 8;
    sl_list *nl = realloc(t->lists, sizeof *nl * (size_t)n);
    if (!nl) return NULL;
    memset(nl + t->n_lists, 0, sizeof *nl * (size_t)(n - t->n_lists));
    t->lists = nl;
    free_slot = &nl[t->n_lists];
    t->n_lists = n;
    return free_slot;
}

/* Room for cap entries a head: a fresh region, and every entry to be sent. 0, or -1. */
static int make_room(sl_table *t, sl_list *L, int n_heads, int64_t dim, int64_t cap)
{
    uint64_t name = L->name;
    drop(t, L);
    L->name = name;
    size_t n = (size_t)n_heads * (size_t)cap;
    L->seen = malloc(sizeof *L->seen * n);   /* written before it is read: fresh pages faulted in once */
    if (L->seen) memset(L->seen, 0, sizeof *L->seen * n);
    L->n_heads = n_heads;
    L->dim = dim;
    L->cap = cap;
    L->dev = L->seen ? t->dev.alloc(t->dev.ud, sizeof(float) * n * 2 * (size_t)dim) : NULL;
    if (!L->dev) return -1;
    t->bytes += sizeof(float) * (uint64_t)n * 2 * (uint64_t)dim;
    L->dev_n = t->dev.alloc(t->dev.ud, sizeof(int64_t) * n);
    if (!L->dev_n) return -1;
    t->bytes += sizeof(int64_t) * (uint64_t)n;
    return 0;
}

static int same(const sl_seen *a, const be_summary *b)
{
    return a->gen && a->gen == b->gen && a->n == b->n && a->mn == b->mn && a->mx == b->mx;
}

void sl_tick(sl_table *t)
{
    if (++t->ticks % SL_IDLE) return;
    for (int i = 0; i < t->n_lists; i++)
        if (t->lists[i].name && t->ticks - t->lists[i].last_use > SL_IDLE) drop(t, &t->lists[i]);
}

/* Summary s of entry `at` queued as a fold (its runs' records) where the device holds every run's
 * rows: 1, else 0 (nothing queued: it is sent). */
static int queue_fold(sl_table *t, const be_summary *s, int64_t at, int64_t dim)
{
    if (!t->dev.copy_rows || s->n <= 0 || s->n > INT32_MAX || at > INT32_MAX) return 0;
    const be_summary_run page = { s->k, s->gen, 0, (int32_t)s->n };
    const be_summary_run *run = s->k ? &page : s->runs;
    const int32_t n = s->k ? 1 : s->n_runs;
    if (!run || n < 1) return 0;
    if (t->n_folds + n > t->cap_folds) {
        int64_t cap = 2 * (t->n_folds + n) > 1024 ? 2 * (t->n_folds + n) : 1024;
        bd_fold *f = realloc(t->folds, sizeof *f * (size_t)cap);
        if (!f) return 0;
        t->folds = f;
        t->cap_folds = cap;
    }
    const int64_t first = t->n_folds;
    for (int32_t j = 0; j < n; j++) {
        const be_summary_run *u = &run[j];
        const uint16_t *d = u->k && u->n > 0 && u->r0 >= 0 && u->r0 <= INT32_MAX - u->n
                                ? t->dev.copy_rows(t->dev.ud, u->k, u->gen, u->r0 + u->n, dim)
                                : NULL;
        if (!d) {
            t->n_folds = first;
            return 0;
        }
        t->folds[t->n_folds++] = (bd_fold){ .k = d + (int64_t)u->r0 * dim, .at = (int32_t)at, .n = u->n,
                                            .runs = j ? 0 : n, .len = j ? 0 : (int32_t)s->n };
    }
    return 1;
}

const sl_list *sl_update(sl_table *t, const be_bounds *r, char *err, size_t errlen)
{
    t->n_folds = 0;
    sl_list *L = find(t, r->table ? r->table : 1);
    if (!L) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    L->name = r->table ? r->table : 1;
    int H = r->n_head_kv;
    if (H < 1 || H > SL_MAX_HEADS) {
        drop(t, L);
        snprintf(err, errlen, "%d KV heads to bound (1 to %d)", H, SL_MAX_HEADS);
        return NULL;
    }
    int64_t need;   /* the most entries of any head */
    be_bounds_total(r, &need);
    if (H != L->n_heads || r->dim != L->dim || need > L->cap) {
        /* room for a decode's new pages: a regrowth sends the whole list again */
        int64_t cap = need + need / 4 + 64;
        if (L->cap * 2 > cap) cap = L->cap * 2;
        if (make_room(t, L, H, r->dim, cap)) {
            drop(t, L);
            snprintf(err, errlen, "out of device memory for %d heads of %lld page summaries", H, (long long)cap);
            return NULL;
        }
        for (int h = 0; h < H; h++) L->n_of[h] = 0;
        L->shape = 0;
    }
    L->last_use = t->ticks;
    int kept = r->shape && r->shape == L->shape;
    size_t half = sizeof(float) * (size_t)r->dim;
    if (need > t->cap_ns) {   /* a run of lengths, copied into the batch at its end */
        int64_t *nn = realloc(t->ns, sizeof *nn * (size_t)need);
        if (!nn) goto oom;
        t->ns = nn;
        t->cap_ns = need;
    }
    for (int h = 0; h < H; h++) {
        int64_t n = be_bounds_count(r, h), from = 0, run0 = -1;
        if (kept && n >= L->n_of[h]) from = L->n_of[h] > 0 ? L->n_of[h] - 1 : 0;
        for (int64_t i = from; i <= n; i++) {
            int send = 0;
            const be_summary *s = i < n ? &r->sum[r->off[h] + i] : NULL;
            int64_t at = (int64_t)h * L->cap + i;
            if (s) {
                sl_seen *seen = &L->seen[at];
                t->looked++;
                if (!same(seen, s)) {
                    *seen = (sl_seen){ s->mn, s->mx, s->gen, s->n };
                    t->sent++;
                    send = !queue_fold(t, s, at, r->dim);
                    t->folded += !send;
                }
            }
            if (send) {
                /* read where they are when the batch goes (before the call returns: a prompt's every
                 * SentKV summary is half a gigabyte at 32K on the 7B shape), the minimum and maximum
                 * in one piece where they lie side by side */
                float *d = L->dev + bd_summary_at(h, L->cap, i, r->dim);
                int both = s->mx == s->mn + r->dim;
                if (ub_add_ref(t->batch, d, s->mn, both ? 2 * half : half) ||
                    (!both && ub_add_ref(t->batch, d + r->dim, s->mx, half)))
                    goto oom;
                if (run0 < 0) run0 = i;
                t->ns[i - run0] = s->n;
                continue;
            }
            /* the run of lengths ends before entry i */
            if (run0 >= 0 && ub_add(t->batch, L->dev_n + (int64_t)h * L->cap + run0, t->ns, sizeof *t->ns * (size_t)(i - run0)))
                goto oom;
            run0 = -1;
        }
        L->n_of[h] = n;
    }
    L->shape = r->shape;
    return L;
oom:
    drop(t, L);   /* part of it may be queued: the caller drops the batch, and this list with it */
    t->n_folds = 0;
    snprintf(err, errlen, "out of memory");
    return NULL;
}
