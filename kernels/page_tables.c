/* page_tables.c - attention's page descriptors kept on the device between calls (see page_tables.h). */
#include "kernels/page_tables.h"
#include "kernels/addr_hash.h"

#include <stdlib.h>
#include <string.h>

void pt_init(pt_set *s, const pt_device *dev, pc_table *copies, ub_batch *batch)
{
    memset(s, 0, sizeof *s);
    s->dev = *dev;
    s->copies = copies;
    s->batch = batch;
}

static size_t dev_bytes(int64_t cap) { return sizeof(ag_page) * (size_t)cap + sizeof(int64_t) * (PT_MAX_HEADS + 1); }

static void drop_list(pt_set *s, pt_list *l)
{
    if (l->dev) {
        s->dev.release(s->dev.ud, l->dev);
        s->bytes -= dev_bytes(l->cap);
    }
    free(l->seen);
    free(l->rec);
    free(l->host);
    free(l->seen2);
    free(l->rec2);
    free(l->host2);
    free(l->moved);
    memset(l, 0, sizeof *l);
}

void pt_free(pt_set *s)
{
    for (int i = 0; i < s->cap_lists; i++)
        if (s->lists[i].used) drop_list(s, &s->lists[i]);
    free(s->lists);
    free(s->masks);
    s->lists = NULL;
    s->masks = NULL;
    s->n_lists = s->cap_lists = 0;
    s->cap_masks = 0;
}

void pt_release_all(pt_set *s)
{
    pt_free(s);   /* pt_free and pc_free leave their tables empty and usable */
    pc_free(s->copies);
}

void pt_forget(pt_set *s)
{
    for (int i = 0; i < s->cap_lists; i++) {
        s->lists[i].n = 0;
        s->lists[i].n_hp = -1;
    }
}

void pt_trim(pt_set *s, uint64_t idle)
{
    int dropped = 0;
    for (int i = 0; i < s->cap_lists; i++)
        if (s->lists[i].used && s->calls - s->lists[i].last_use > idle) {
            drop_list(s, &s->lists[i]);   /* leaves the slot unused */
            s->n_lists--;
            dropped = 1;
        }
    if (!dropped) return;
    /* the live lists put back where lookups find them (out of host memory: the holes stay, and a
     * lookup that stops at one makes a second list of the name, built whole: slower, still right,
     * since the first keeps its copies current and goes when it has been idle long enough) */
    pt_list *nl = calloc((size_t)s->cap_lists, sizeof *nl);
    if (!nl) return;
    uint64_t mask = (uint64_t)(s->cap_lists - 1);
    for (int i = 0; i < s->cap_lists; i++) {
        if (!s->lists[i].used) continue;
        uint64_t h = bits_hash(s->lists[i].name) & mask;
        while (nl[h].used) h = (h + 1) & mask;
        nl[h] = s->lists[i];
    }
    free(s->lists);
    s->lists = nl;
}

/* p reallocated to bytes, or p as it was with *ok cleared when the host is out of memory. */
static void *grow_array(void *p, size_t bytes, int *ok)
{
    void *n = realloc(p, bytes);
    if (n) return n;
    *ok = 0;
    return p;
}

/* Room for e entries: a larger device array (the old one released; what it held is sent again). */
static int grow_list(pt_set *s, pt_list *l, int64_t e)
{
    if (e <= l->cap) return PT_OK;
    int64_t cap = l->cap ? l->cap : 64;
    while (cap < e) cap *= 2;
    /* the host arrays (on failure those grown stay so, and the device array as it was) */
    int ok = 1;
    size_t c = (size_t)cap;
    l->seen = grow_array(l->seen, sizeof *l->seen * c, &ok);
    l->rec = grow_array(l->rec, sizeof *l->rec * c, &ok);
    l->host = grow_array(l->host, sizeof *l->host * c, &ok);
    l->seen2 = grow_array(l->seen2, sizeof *l->seen2 * c, &ok);
    l->rec2 = grow_array(l->rec2, sizeof *l->rec2 * c, &ok);
    l->host2 = grow_array(l->host2, sizeof *l->host2 * c, &ok);
    l->moved = grow_array(l->moved, sizeof *l->moved * c, &ok);
    if (!ok) return PT_NO_HOST_MEMORY;
    void *dev = s->dev.alloc(s->dev.ud, dev_bytes(cap));
    if (!dev) return PT_NO_DEVICE_MEMORY;
    if (l->dev) {
        s->dev.release(s->dev.ud, l->dev);
        s->bytes -= dev_bytes(l->cap);
    }
    l->dev = dev;
    s->bytes += dev_bytes(cap);
    l->cap = cap;
    l->n = 0;   /* nothing of the new array is on the device yet */
    l->n_hp = -1;
    return PT_OK;
}

static int same_page(const be_kv_page *a, const be_kv_page *b)
{
    return a->k == b->k && a->v == b->v && a->pos == b->pos && a->bias == b->bias && a->mask == b->mask &&
           a->n == b->n && a->stride == b->stride && a->head_step == b->head_step && a->gen == b->gen &&
           a->cap == b->cap;
}

static int same_desc(const ag_page *a, const ag_page *b)
{
    return a->k == b->k && a->v == b->v && a->pos == b->pos && a->bias == b->bias && a->mask_off == b->mask_off &&
           a->n == b->n && a->stride == b->stride && a->head_step == b->head_step;
}

static int whole_loads(const ag_page *d)
{
    return d->n <= 0 || (d->stride % AG_DL == 0 && d->head_step % AG_DL == 0 &&
                         ((uintptr_t)d->k | (uintptr_t)d->v) % (AG_DL * sizeof(uint16_t)) == 0);
}

/* The heads' offsets changed (a head's list grew or shrank): entry j of head g moves from its old
 * index to hp[g] + j, and the mirror follows it (a moved descriptor is sent again, not rebuilt);
 * an entry the head did not have before is built. */
static void remap(pt_list *l, const int64_t *hp, int n_heads, int64_t e)
{
    int old_heads = l->n_hp - 1;
    for (int g = 0; g < n_heads; g++) {
        int64_t n_old = g < old_heads ? l->hp[g + 1] - l->hp[g] : 0;
        for (int64_t j = 0; j < hp[g + 1] - hp[g]; j++) {
            int64_t i = hp[g] + j, oi = g < old_heads ? l->hp[g] + j : -1;
            if (j < n_old && oi < l->n) {
                l->seen2[i] = l->seen[oi];
                l->rec2[i] = l->rec[oi];
                l->host2[i] = l->host[oi];
                l->moved[i] = i != oi;
            } else {
                l->rec2[i] = PT_REBUILD;
                l->moved[i] = 1;
            }
        }
    }
    be_kv_page *ts = l->seen;
    l->seen = l->seen2;
    l->seen2 = ts;
    int32_t *tr = l->rec;
    l->rec = l->rec2;
    l->rec2 = tr;
    ag_page *th = l->host;
    l->host = l->host2;
    l->host2 = th;
    l->n = e;
}

/* Queue entries [i0, i1) of the host descriptors for the device. */
static int send_run(pt_set *s, pt_list *l, int64_t i0, int64_t i1)
{
    if (i1 <= i0) return PT_OK;
    return ub_add(s->batch, l->dev + i0, l->host + i0, sizeof(ag_page) * (size_t)(i1 - i0)) ? PT_NO_HOST_MEMORY
                                                                                               : PT_OK;
}

/* This call's mask words: room for nw more. -1 when the host is out of memory. */
static int mask_room(pt_set *s, size_t w, size_t nw)
{
    if (w + nw <= s->cap_masks) return 0;
    size_t cap = (w + nw) * 2;
    uint64_t *nm = realloc(s->masks, sizeof *nm * cap);
    if (!nm) return -1;
    s->masks = nm;
    s->cap_masks = cap;
    return 0;
}

static void count_entry(pt_list *l, const ag_page *d, int sign)
{
    l->n_bias += sign * (d->bias != NULL);
    l->n_unaligned += sign * !whole_loads(d);
}

/* pg's rows are in the device bytes the call gave as they are (rows the cache takes later). */
static int is_direct(const be_kv_page *pg, const pt_direct *direct)
{
    const char *k = (const char *)pg->k, *p = direct ? (const char *)direct->p : NULL;
    return p && k >= p && k < p + direct->bytes;
}

/* Entry i of the list is pg: left as it is when its descriptor still holds, else built (pc_get
 * sends the page's new rows). *send: its descriptor must go to the device. */
static int do_entry(pt_set *s, pt_list *l, int64_t i, const be_kv_page *pg, const pt_direct *direct, size_t *w,
                    int *send)
{
    int keep = i < l->n && l->rec[i] != PT_REBUILD && same_page(pg, &l->seen[i]) &&
               (l->rec[i] == PT_DIRECT || pg->n <= 0 || pc_current(s->copies, l->rec[i], pg, l->host[i].k));
    if (keep) {
        s->kept++;
        return PT_OK;
    }
    ag_page d = { 0 };
    d.n = pg->n;
    d.stride = pg->stride;
    d.head_step = pg->head_step;
    d.mask_off = -1;
    int32_t rec = PT_DIRECT;   /* an empty entry: nothing to read, nothing to keep current */
    if (pg->n > 0 && is_direct(pg, direct)) {
        d.k = pg->k;
        d.v = pg->v;
        d.pos = pg->pos;
    } else if (pg->n > 0) {
        const pc_copy *c = pc_get(s->copies, pg);
        if (!c) return PT_NO_COPY;
        d.k = c->k;
        d.v = c->v;
        d.pos = c->pos;
        d.bias = pg->bias ? c->bias : NULL;
        rec = pg->mask ? PT_REBUILD : pc_index(s->copies, c);
        if (pg->mask) {
            size_t nw = (size_t)(pg->n + 63) / 64;
            if (mask_room(s, *w, nw)) return PT_NO_HOST_MEMORY;
            memcpy(s->masks + *w, pg->mask, sizeof(uint64_t) * nw);
            d.mask_off = (int64_t)*w;
            *w += nw;
        }
    }
    s->built++;
    l->seen[i] = *pg;
    l->rec[i] = rec;
    if (i >= l->n || !same_desc(&d, &l->host[i])) {
        if (i < l->n) count_entry(l, &l->host[i], -1);
        count_entry(l, &d, 1);
        l->host[i] = d;
        *send = 1;
    }
    return PT_OK;
}

/* Entries [i0, i1) through do_entry, the descriptors that must go to the device queued in runs. */
static int do_range(pt_set *s, pt_list *l, const be_kv_page *list, int64_t i0, int64_t i1, int moved,
                    const pt_direct *direct, size_t *w)
{
    int64_t run0 = -1;   /* the first entry of the run of descriptors to send, -1: none open */
    for (int64_t i = i0; i < i1; i++) {
        int send = moved && l->moved[i];   /* the device's entry i is another page's descriptor */
        int rc = do_entry(s, l, i, &list[i], direct, w, &send);
        if (rc != PT_OK) return rc;
        if (send) {
            if (run0 < 0) run0 = i;
            continue;
        }
        /* entry i is on the device as it should be: the open run ends before it */
        if (run0 >= 0 && (rc = send_run(s, l, run0, i)) != PT_OK) return rc;
        run0 = -1;
    }
    return run0 >= 0 ? send_run(s, l, run0, i1) : PT_OK;
}

/* Whether a call under shape with offsets hp only appends to l as l stands (the same name and
 * shape; a list whose array must grow is built whole): stable[g], head g's entries that are as
 * the last call left them (its pages before its last one). *moved: the offsets changed, so the
 * entries move and every one is looked at. */
static int appends(const pt_list *l, uint64_t shape, const int64_t *hp, int n_heads, int64_t *stable, int *moved)
{
    int heads_same = hp && l->n_hp == n_heads + 1 && l->n > 0;
    int appended = shape != 0 && shape == l->shape && heads_same;
    *moved = heads_same && memcmp(l->hp, hp, sizeof(int64_t) * (size_t)(n_heads + 1)) != 0;
    if (appended)
        for (int g = 0; g < n_heads; g++) {
            stable[g] = l->pages_of[g] - 1;   /* the last page may have grown */
            if (stable[g] > hp[g + 1] - hp[g]) appended = 0;   /* not an append after all */
        }
    return appended;
}

static const pt_list *peek_list(const pt_set *s, uint64_t name)
{
    if (!s->cap_lists) return NULL;
    uint64_t mask = (uint64_t)(s->cap_lists - 1), h = bits_hash(name) & mask;
    for (; s->lists[h].used; h = (h + 1) & mask)
        if (s->lists[h].name == name) return &s->lists[h];
    return NULL;
}

int pt_reads_from(const pt_set *s, uint64_t name, uint64_t shape, const int64_t *hp, int n_heads, int64_t *from)
{
    const pt_list *l = n_heads <= PT_MAX_HEADS && hp ? peek_list(s, name) : NULL;
    int64_t stable[PT_MAX_HEADS];
    int moved;
    if (!l || hp[n_heads] > l->cap || !appends(l, shape, hp, n_heads, stable, &moved) || moved) return 0;
    for (int g = 0; g < n_heads; g++) from[g] = hp[g] + (stable[g] > 0 ? stable[g] : 0);
    return 1;
}

/* The list named `name`, made when there is none (NULL when the host is out of memory). */
static pt_list *find_list(pt_set *s, uint64_t name)
{
    if ((s->n_lists + 1) * 2 > s->cap_lists) {
        int cap = s->cap_lists ? s->cap_lists * 2 : 64;
        pt_list *nl = calloc((size_t)cap, sizeof *nl);
        if (!nl) return NULL;
        for (int i = 0; i < s->cap_lists; i++) {
            if (!s->lists[i].used) continue;
            uint64_t h = bits_hash(s->lists[i].name) & (uint64_t)(cap - 1);
            while (nl[h].used) h = (h + 1) & (uint64_t)(cap - 1);
            nl[h] = s->lists[i];
        }
        free(s->lists);
        s->lists = nl;
        s->cap_lists = cap;
    }
    uint64_t mask = (uint64_t)(s->cap_lists - 1), h = bits_hash(name) & mask;
    while (s->lists[h].used && s->lists[h].name != name) h = (h + 1) & mask;
    pt_list *l = &s->lists[h];
    if (!l->used) {
        memset(l, 0, sizeof *l);
        l->used = 1;
        l->name = name;
        l->n_hp = -1;
        s->n_lists++;
    }
    return l;
}

int pt_build(pt_set *s, uint64_t name, uint64_t shape, const be_kv_page *list, int64_t e, const int64_t *hp,
             int n_heads, const pt_direct *direct, pt_call *out)
{
    memset(out, 0, sizeof *out);
    if (n_heads > PT_MAX_HEADS || (hp && (hp[0] != 0 || hp[n_heads] != e))) return PT_BAD_LIST;
    s->calls++;
    pt_list *l = find_list(s, name);
    if (!l) return PT_NO_HOST_MEMORY;
    l->last_use = s->calls;
    int rc = grow_list(s, l, e > 0 ? e : 1);
    if (rc != PT_OK) return rc;
    /* Only appended to since the last call (the same name and shape): each head's pages before its
     * last one are the same. Entries are matched head by head: when the offsets moved, so do the
     * entries (and every entry is looked at). */
    int64_t stable[PT_MAX_HEADS];
    int moved, appended = appends(l, shape, hp, n_heads, stable, &moved);
    if (moved) remap(l, hp, n_heads, e);
    size_t w = 0;
    if (appended && !moved) {
        for (int g = 0; g < n_heads && rc == PT_OK; g++) {
            s->kept += (uint64_t)(stable[g] > 0 ? stable[g] : 0);
            rc = do_range(s, l, list, hp[g] + (stable[g] > 0 ? stable[g] : 0), hp[g + 1], 0, direct, &w);
        }
    } else {
        rc = do_range(s, l, list, 0, e, moved, direct, &w);
        if (rc == PT_OK) {   /* counted afresh, the entries past e gone */
            l->n_bias = l->n_unaligned = 0;
            for (int64_t i = 0; i < e; i++) count_entry(l, &l->host[i], 1);
        }
    }
    if (rc != PT_OK) return rc;
    l->n = e;
    l->shape = shape;
    /* each head's entries that are pages (not rows the cache takes later), for the next append */
    for (int g = 0; hp && g < n_heads; g++) {
        int64_t c = hp[g + 1] - hp[g];
        while (c > 0 && is_direct(&list[hp[g] + c - 1], direct)) c--;
        l->pages_of[g] = c;
    }
    int64_t *hp_dev = (int64_t *)(l->dev + l->cap);
    if (hp) {
        if (l->n_hp != n_heads + 1 || memcmp(l->hp, hp, sizeof(int64_t) * (size_t)(n_heads + 1))) {
            memcpy(l->hp, hp, sizeof(int64_t) * (size_t)(n_heads + 1));
            if (ub_add(s->batch, hp_dev, l->hp, sizeof(int64_t) * (size_t)(n_heads + 1))) return PT_NO_HOST_MEMORY;
            l->n_hp = n_heads + 1;
        }
        out->head_pages = hp_dev;
    } else {
        l->n_hp = -1;
    }
    out->pages = l->dev;
    out->masks = w ? s->masks : NULL;
    out->n_words = w;
    out->has_bias = l->n_bias > 0;
    out->aligned = l->n_unaligned == 0;
    return PT_OK;
}

void pt_begin_call(pt_set *s, uint64_t idle)
{
    pc_table *c = s->copies;
    if ((c->calls + 1) % c->idle == 0) {
        /* the copies' idle sweep is next: lists unused as long go first, and every copy a live list
         * holds counts as used (an appended list's earlier pages are not looked at each call) */
        pt_trim(s, idle);
        for (int li = 0; li < s->cap_lists; li++) {
            pt_list *l = &s->lists[li];
            if (!l->used) continue;
            for (int64_t i = 0; i < l->n; i++)
                if (l->rec[i] >= 0 && !pc_current(c, l->rec[i], &l->seen[i], l->host[i].k)) {
                    l->n = 0;   /* cannot be: built whole next time */
                    break;
                }
        }
    }
    pc_begin_call(c);
}
