/* const_copies.c - device copies of small constant inputs (see const_copies.h). */
#include "kernels/const_copies.h"
#include "kernels/addr_hash.h"

#include <stdlib.h>
#include <string.h>

void cc_init(cc_table *t, const cc_device *dev)
{
    memset(t, 0, sizeof *t);
    t->dev = *dev;
}

void cc_free(cc_table *t)
{
    for (int i = 0; i < t->cap; i++) {
        if (t->slots[i].dev) t->dev.release(t->dev.ud, t->slots[i].dev);
        free(t->slots[i].seen);
    }
    free(t->slots);
    t->slots = NULL;
    t->cap = t->n = 0;
    t->bytes = 0;
}

/* Twice the slots, every entry moved by its key; the table itself is all that changes. */
static int grow(cc_table *t)
{
    int nc = t->cap ? t->cap * 2 : 256;
    cc_copy *ns = calloc((size_t)nc, sizeof *ns);
    if (!ns) return -1;
    for (int i = 0; i < t->cap; i++) {
        if (!t->slots[i].host) continue;
        uint64_t h = addr_hash(t->slots[i].host) & (uint64_t)(nc - 1);
        while (ns[h].host) h = (h + 1) & (uint64_t)(nc - 1);
        ns[h] = t->slots[i];
    }
    free(t->slots);
    t->slots = ns;
    t->cap = nc;
    return 0;
}

/* The slot holding host, or the empty one where it would go (the table has slots). */
static cc_copy *slot_of(const cc_table *t, const void *host)
{
    uint64_t m = (uint64_t)(t->cap - 1), h = addr_hash(host) & m;
    while (t->slots[h].host && t->slots[h].host != host) h = (h + 1) & m;
    return &t->slots[h];
}

/* cc_get (write NULL: new or changed bytes uploaded) and cc_claim (*write: the caller writes them). */
static const void *get(cc_table *t, const void *host, size_t bytes, int *write, enum cc_status *status)
{
    *status = CC_OK;
    if (write) *write = 0;
    if ((t->n + 1) * 2 > t->cap && grow(t)) {
        *status = CC_NO_HOST_MEMORY;
        return NULL;
    }
    cc_copy *c = slot_of(t, host);
    if (c->host && bytes <= c->fixed && c->bytes >= bytes && !c->stale) return c->dev;
    /* the same bytes, or the first bytes of the copy (a batch's positions: qk_rope sends every
     * row's, each sequence's attention asks for its own, the first under the same key) */
    if (c->host && c->bytes >= bytes && c->seen && !c->stale && !memcmp(c->seen, host, bytes)) return c->dev;
    if (!c->host || !c->dev || bytes > c->room) {
        if (c->host) {
            if (c->dev) t->dev.release(t->dev.ud, c->dev);
            free(c->seen);
            t->bytes -= c->room;
        } else {
            t->n++;
        }
        c->host = host;
        c->bytes = c->room = bytes;
        c->seen = malloc(bytes);
        c->dev = c->seen ? t->dev.alloc(t->dev.ud, bytes) : NULL;
        if (!c->dev) {
            *status = c->seen ? CC_NO_DEVICE_MEMORY : CC_NO_HOST_MEMORY;
            free(c->seen);
            c->seen = c->dev = NULL;
            c->bytes = c->room = 0;
            return NULL;
        }
        t->bytes += bytes;
    }
    c->bytes = bytes;
    /* new or changed: later device work sees the new bytes, earlier work the old (one stream) */
    if (write) {
        *write = 1;
        memcpy(c->seen, host, bytes);
        c->stale = 0;
        return c->dev;
    }
    if (t->dev.upload(t->dev.ud, c->dev, host, bytes)) {
        c->stale = 1;   /* the device may hold neither the old bytes nor the new: send them next time */
        *status = CC_NOT_SENT;
        return NULL;
    }
    memcpy(c->seen, host, bytes);
    c->stale = 0;
    t->uploads++;
    return c->dev;
}

const void *cc_get(cc_table *t, const void *host, size_t bytes, enum cc_status *status)
{
    return get(t, host, bytes, NULL, status);
}

const void *cc_claim(cc_table *t, const void *host, size_t bytes, int *write, enum cc_status *status)
{
    return get(t, host, bytes, write, status);
}

void cc_unwritten(cc_table *t, const void *host)
{
    cc_copy *c = t->cap ? slot_of(t, host) : NULL;
    if (c && c->host == host) c->stale = 1;
}

const void *cc_fix(cc_table *t, const void *host, size_t bytes, enum cc_status *status)
{
    const void *d = get(t, host, bytes, NULL, status);
    cc_copy *c = d ? slot_of(t, host) : NULL;
    if (c && bytes > c->fixed) c->fixed = bytes;
    return d;
}
