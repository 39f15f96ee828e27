/* page_copies.c - device copies of KV pages, kept current by content generations (see page_copies.h). */
#include "kernels/page_copies.h"
#include "kernels/addr_hash.h"

#include <stdlib.h>
#include <string.h>

void pc_init(pc_table *t, const pc_device *dev, uint64_t idle)
{
    memset(t, 0, sizeof *t);
    t->dev = *dev;
    t->idle = idle > 0 ? idle : 1;
}

static uint64_t copy_bytes(int32_t cap, int32_t stride)
{
    return (uint64_t)cap * ((uint64_t)stride * 2 * sizeof(uint16_t) + sizeof(int32_t) + sizeof(float));
}

static void drop_storage(pc_table *t, pc_copy *c)
{
    if (!c->k) return;
    t->dev.release(t->dev.ud, c->k);   /* the one allocation that holds all four */
    t->bytes -= copy_bytes(c->cap, c->stride);
    c->k = c->v = NULL;
    c->pos = NULL;
    c->bias = NULL;
    c->cap = c->n_up = c->bias_up = 0;
}

void pc_free(pc_table *t)
{
    for (int i = 0; i < t->n_recs; i++)
        if (t->recs[i].used) drop_storage(t, &t->recs[i]);
    free(t->recs);
    free(t->free_recs);
    free(t->slots);
    t->recs = NULL;
    t->free_recs = t->slots = NULL;
    t->n_recs = t->cap_recs = t->n_free = t->cap = t->n = t->holes = 0;
}

/* Rebuild the hash with cap slots over the live records (also closes the holes freed records leave
 * in probe sequences). -1 when the host is out of memory (the hash is unchanged). */
static int rehash(pc_table *t, int cap)
{
    int32_t *ns = malloc(sizeof *ns * (size_t)cap);
    if (!ns) return -1;
    for (int i = 0; i < cap; i++) ns[i] = -1;
    for (int i = 0; i < t->n_recs; i++) {
        if (!t->recs[i].used) continue;
        uint64_t h = addr_hash(t->recs[i].host_k) & (uint64_t)(cap - 1);
        while (ns[h] >= 0) h = (h + 1) & (uint64_t)(cap - 1);
        ns[h] = i;
    }
    free(t->slots);
    t->slots = ns;
    t->cap = cap;
    t->holes = 0;
    return 0;
}

void pc_begin_call(pc_table *t)
{
    t->calls++;
    if (t->calls % t->idle != 0 || t->cap == 0) return;
    int kept = 0;
    for (int i = 0; i < t->n_recs; i++) {
        pc_copy *c = &t->recs[i];
        if (!c->used) continue;
        if (c->held <= 0 && t->calls - c->last_use > t->idle) {
            drop_storage(t, c);
            memset(c, 0, sizeof *c);
            t->free_recs[t->n_free++] = i;   /* room for every record was made with it */
        } else {
            kept++;
        }
    }
    int dropped = kept < t->n;
    t->n = kept;
    if (!dropped && t->holes == 0) return;   /* no record freed: the hash is as it was (a long decode's every sweep) */
    /* on failure the holes stay: lookups skip freed records and still end at an empty slot */
    if (rehash(t, t->cap)) {
        for (int i = 0; i < t->cap; i++)
            if (t->slots[i] >= 0 && !t->recs[t->slots[i]].used) {
                t->slots[i] = -2;   /* a hole */
                t->holes++;
            }
    }
}

/* A free record's index, making room for more (with its place on the free stack) when none is
 * left. -1 when the host is out of memory. */
static int32_t new_record(pc_table *t)
{
    if (t->n_free > 0) return t->free_recs[--t->n_free];
    if (t->n_recs == t->cap_recs) {
        int cap = t->cap_recs ? t->cap_recs * 2 : 256;
        pc_copy *nr = realloc(t->recs, sizeof *nr * (size_t)cap);
        if (!nr) return -1;
        t->recs = nr;
        int32_t *nf = realloc(t->free_recs, sizeof *nf * (size_t)cap);
        if (!nf) return -1;
        t->free_recs = nf;
        t->cap_recs = cap;
    }
    memset(&t->recs[t->n_recs], 0, sizeof t->recs[0]);
    return t->n_recs++;
}

/* Give c storage for cap rows of stride elements: one allocation, keys, then values, positions and
 * biases (every page of a cache asks for the same size, which a device's block pool serves without
 * a device allocation each). -1 when the device is out of memory. */
static int make_storage(pc_table *t, pc_copy *c, int32_t cap, int32_t stride)
{
    size_t kv = sizeof(uint16_t) * (size_t)cap * (size_t)stride;
    char *base = t->dev.alloc(t->dev.ud, (size_t)copy_bytes(cap, stride));
    if (!base) return -1;
    drop_storage(t, c);
    c->k = (uint16_t *)base;
    c->v = (uint16_t *)(base + kv);
    c->pos = (int32_t *)(base + 2 * kv);
    c->bias = (float *)(base + 2 * kv + sizeof(int32_t) * (size_t)cap);
    c->cap = cap;
    c->stride = stride;
    c->n_up = c->bias_up = 0;
    t->bytes += copy_bytes(cap, stride);
    return 0;
}

/* The copy of page pg, found or made, with storage for its rows and its rows counted as sent only
 * within pg's generation. NULL when out of memory. */
static pc_copy *copy_of(pc_table *t, const be_kv_page *pg)
{
    /* at most half full, holes counted, so every probe ends at an empty slot */
    if ((t->n + t->holes + 1) * 2 > t->cap && rehash(t, t->cap ? t->cap * 2 : 1024)) return NULL;
    uint64_t mask = (uint64_t)(t->cap - 1), h = addr_hash(pg->k) & mask;
    /* -2 is a hole a failed rehash left: passed over, since a later slot may hold the page */
    while (t->slots[h] != -1 && (t->slots[h] < 0 || t->recs[t->slots[h]].host_k != pg->k)) h = (h + 1) & mask;
    int fresh = t->slots[h] < 0;
    int32_t idx = fresh ? new_record(t) : t->slots[h];
    if (idx < 0) return NULL;
    pc_copy *c = &t->recs[idx];
    int32_t rows = pg->n, stride = pg->stride;
    if (fresh || rows > c->cap || c->stride != stride) {
        /* room for every row the page can hold, so appends never move the copy */
        int32_t want = pg->cap > rows ? pg->cap : rows;
        if (make_storage(t, c, want > c->cap ? want : c->cap, stride)) {
            if (fresh) t->free_recs[t->n_free++] = idx;
            return NULL;
        }
    }
    if (fresh) {
        c->used = 1;
        c->host_k = pg->k;
        t->slots[h] = idx;
        t->n++;
    }
    /* rows below n_up are right only within the generation they were copied under */
    if (c->gen != pg->gen || rows < c->n_up) c->n_up = c->bias_up = 0;
    c->gen = pg->gen;
    return c;
}

/* c's rows [c->n_up, upto) sent from pg, then pg's biases not sent yet. 0, or -1 when an upload
 * failed (what arrived is then unknown: everything goes again next time). */
static int send_rows(pc_table *t, pc_copy *c, const be_kv_page *pg, int32_t upto)
{
    if (upto > c->n_up) {
        size_t r0 = (size_t)c->n_up, nr = (size_t)(upto - c->n_up), st = (size_t)pg->stride;
        if (t->dev.upload(t->dev.ud, c->k + r0 * st, pg->k + r0 * st, sizeof(uint16_t) * nr * st) ||
            t->dev.upload(t->dev.ud, c->v + r0 * st, pg->v + r0 * st, sizeof(uint16_t) * nr * st) ||
            t->dev.upload(t->dev.ud, c->pos + r0, pg->pos + r0, sizeof(int32_t) * nr)) {
            c->n_up = c->bias_up = 0;
            return -1;
        }
        t->rows_uploaded += nr;
        c->n_up = upto;
    }
    /* the merged tokens' log-degrees (few pages have them), like the rows: what was not sent yet */
    if (pg->bias && pg->n > c->bias_up) {
        if (t->dev.upload(t->dev.ud, c->bias + c->bias_up, pg->bias + c->bias_up,
                          sizeof(float) * (size_t)(pg->n - c->bias_up))) {
            c->bias_up = 0;
            return -1;
        }
        c->bias_up = pg->n;
    }
    return 0;
}

const pc_copy *pc_get(pc_table *t, const be_kv_page *pg)
{
    pc_copy *c = copy_of(t, pg);
    if (!c || send_rows(t, c, pg, pg->n)) return NULL;
    c->last_use = t->calls;
    return c;
}

pc_copy *pc_fill(pc_table *t, const be_kv_page *pg, int32_t row0, int32_t n)
{
    if (row0 < 0 || n <= 0 || row0 + n > pg->n) return NULL;
    pc_copy *c = copy_of(t, pg);
    if (!c || send_rows(t, c, pg, row0)) return NULL;
    c->n_up = row0 + n;   /* the caller writes them, before anything reads the copy */
    t->rows_filled += (uint64_t)n;
    c->last_use = t->calls;
    return c;
}

const pc_copy *pc_find(pc_table *t, const be_kv_page *pg, int32_t rows)
{
    if (!t->cap || rows <= 0 || rows > pg->n) return NULL;
    uint64_t mask = (uint64_t)(t->cap - 1), h = addr_hash(pg->k) & mask;
    while (t->slots[h] != -1 && (t->slots[h] < 0 || t->recs[t->slots[h]].host_k != pg->k)) h = (h + 1) & mask;
    if (t->slots[h] < 0) return NULL;
    pc_copy *c = &t->recs[t->slots[h]];
    if (c->gen != pg->gen || c->stride != pg->stride || c->n_up < rows || (pg->bias && c->bias_up < rows)) return NULL;
    c->last_use = t->calls;
    return c;
}

int32_t pc_index(const pc_table *t, const pc_copy *c) { return (int32_t)(c - t->recs); }

void pc_hold(pc_table *t, int32_t idx, int delta)
{
    if (idx >= 0 && idx < t->n_recs) t->recs[idx].held += delta;
}

int pc_current(pc_table *t, int32_t idx, const be_kv_page *pg, const void *dev_k)
{
    if (idx < 0 || idx >= t->n_recs) return 0;
    pc_copy *c = &t->recs[idx];
    if (!c->used || c->host_k != pg->k || c->gen != pg->gen || c->n_up < pg->n || c->stride != pg->stride ||
        (pg->bias && c->bias_up < pg->n) || (const void *)c->k != dev_k)
        return 0;
    c->last_use = t->calls;
    return 1;
}

void pc_forget_rows(pc_table *t)
{
    for (int i = 0; i < t->n_recs; i++) t->recs[i].n_up = t->recs[i].bias_up = 0;
}
