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
    c->cap = c->n_up = 0;
}

void pc_free(pc_table *t)
{
    for (int i = 0; i < t->cap; i++)
        if (t->slots[i].used) drop_storage(t, &t->slots[i]);
    free(t->slots);
    t->slots = NULL;
    t->cap = t->n = 0;
}

/* Rebuild the table with cap slots (also closes the holes freed slots leave in probe sequences).
 * -1 when the host is out of memory (the table is unchanged). */
static int rehash(pc_table *t, int cap)
{
    pc_copy *ns = calloc((size_t)cap, sizeof *ns);
    if (!ns) return -1;
    for (int i = 0; i < t->cap; i++) {
        if (!t->slots[i].used) continue;
        uint64_t h = addr_hash(t->slots[i].host_k) & (uint64_t)(cap - 1);
        while (ns[h].used) h = (h + 1) & (uint64_t)(cap - 1);
        ns[h] = t->slots[i];
    }
    free(t->slots);
    t->slots = ns;
    t->cap = cap;
    return 0;
}

void pc_begin_call(pc_table *t)
{
    t->calls++;
    if (t->calls % t->idle != 0 || t->cap == 0) return;
    int kept = 0;
    for (int i = 0; i < t->cap; i++) {
        pc_copy *c = &t->slots[i];
        if (!c->used) continue;
        if (t->calls - c->last_use > t->idle) {
            drop_storage(t, c);
            memset(c, 0, sizeof *c);
        } else {
            kept++;
        }
    }
    t->n = kept;
    rehash(t, t->cap);   /* on failure the holes stay: lookups still end at an empty slot */
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
    c->n_up = 0;
    t->bytes += copy_bytes(cap, stride);
    return 0;
}

const pc_copy *pc_get(pc_table *t, const be_kv_page *pg)
{
    if ((t->n + 1) * 2 > t->cap && rehash(t, t->cap ? t->cap * 2 : 1024)) return NULL;
    uint64_t mask = (uint64_t)(t->cap - 1), h = addr_hash(pg->k) & mask;
    while (t->slots[h].used && t->slots[h].host_k != pg->k) h = (h + 1) & mask;
    pc_copy *c = &t->slots[h];
    int fresh = !c->used;
    int32_t rows = pg->n, stride = pg->stride;
    if (fresh || rows > c->cap || c->stride != stride) {
        /* room for every row the page can hold, so appends never move the copy */
        int32_t want = pg->cap > rows ? pg->cap : rows;
        if (make_storage(t, c, want > c->cap ? want : c->cap, stride)) return NULL;
    }
    if (fresh) {
        c->used = 1;
        c->host_k = pg->k;
        t->n++;
    }
    /* rows below n_up are right only within the generation they were copied under */
    if (c->gen != pg->gen || rows < c->n_up) c->n_up = 0;
    c->gen = pg->gen;
    if (rows > c->n_up) {
        size_t r0 = (size_t)c->n_up, nr = (size_t)(rows - c->n_up), st = (size_t)stride;
        if (t->dev.upload(t->dev.ud, c->k + r0 * st, pg->k + r0 * st, sizeof(uint16_t) * nr * st) ||
            t->dev.upload(t->dev.ud, c->v + r0 * st, pg->v + r0 * st, sizeof(uint16_t) * nr * st) ||
            t->dev.upload(t->dev.ud, c->pos + r0, pg->pos + r0, sizeof(int32_t) * nr)) {
            c->n_up = 0;   /* what arrived is unknown: everything goes again next time */
            return NULL;
        }
        t->rows_uploaded += nr;
        c->n_up = rows;
    }
    /* the merged tokens' log-degrees: few pages have them; sent with every use */
    if (pg->bias && t->dev.upload(t->dev.ud, c->bias, pg->bias, sizeof(float) * (size_t)rows)) return NULL;
    c->last_use = t->calls;
    return c;
}
