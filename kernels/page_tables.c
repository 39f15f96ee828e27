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

/* Region g's counted entries [j0, j1) of the record (those below cnt[g]) hold (delta 1) or let go
 * of (-1) the copies they name. */
static void hold_range(pt_set *s, const pt_list *l, int g, int64_t j0, int64_t j1, int delta)
{
    for (int64_t j = j0; j < j1; j++) pc_hold(s->copies, l->rec[(int64_t)g * l->stride + j], delta);
}

/* Every counted entry lets go of its copy, and none is counted (the record forgotten). */
static void release_record(pt_set *s, pt_list *l)
{
    for (int g = 0; g < l->n_reg; g++) {
        hold_range(s, l, g, 0, l->cnt[g], -1);
        l->cnt[g] = 0;
        l->blind[g] = 0;
    }
}

static int has_blind(const pt_list *l)
{
    for (int g = 0; g < l->n_reg; g++)
        if (l->blind[g] > 0) return 1;
    return 0;
}

static void drop_list(pt_set *s, pt_list *l)
{
    release_record(s, l);
    if (l->dev) {
        s->dev.release(s->dev.ud, l->dev);
        s->bytes -= dev_bytes(l->cap);
    }
    if (l->dev_alt) {
        s->dev.release(s->dev.ud, l->dev_alt);
        s->bytes -= dev_bytes(l->cap);
    }
    free(l->seen);
    free(l->rec);
    free(l->host);
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
    if (s->clone_unsent) return;   /* a list the unsent copy reads may be idle: the next sweep */
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

/* Room for e entries on the device: a larger array (the old ones released; what they held is sent
 * again). */
static int grow_list(pt_set *s, pt_list *l, int64_t e)
{
    if (e <= l->cap) return PT_OK;
    int64_t cap = l->cap ? l->cap : 64;
    while (cap < e) cap *= 2;
    void *dev = s->dev.alloc(s->dev.ud, dev_bytes(cap));
    if (!dev) return PT_NO_DEVICE_MEMORY;
    if (l->dev) {
        s->dev.release(s->dev.ud, l->dev);
        s->bytes -= dev_bytes(l->cap);
    }
    if (l->dev_alt) {
        s->dev.release(s->dev.ud, l->dev_alt);
        s->bytes -= dev_bytes(l->cap);
        l->dev_alt = NULL;
    }
    l->dev = dev;
    s->bytes += dev_bytes(cap);
    l->cap = cap;
    l->n = 0;   /* nothing of the new array is on the device yet */
    l->n_hp = -1;
    return PT_OK;
}

/* The host's record laid out for n_reg regions of at least `most` entries each: kept as it is where
 * it has the room, else moved into larger regions (a quarter more than asked: a head's growth
 * moves the record once in many pages). A record of another region count is forgotten. */
static int fit_record(pt_set *s, pt_list *l, int n_reg, int64_t most)
{
    if (n_reg != l->n_reg) {
        release_record(s, l);
        l->n = 0;
    }
    if (n_reg == l->n_reg && most <= l->stride) return PT_OK;
    int64_t stride = most + most / 4 + 16;
    size_t c = (size_t)n_reg * (size_t)stride;
    be_kv_page *seen = malloc(sizeof *seen * c);
    int32_t *rec = malloc(sizeof *rec * c);
    ag_page *host = malloc(sizeof *host * c);
    if (!seen || !rec || !host) {
        free(seen);
        free(rec);
        free(host);
        return PT_NO_HOST_MEMORY;
    }
    for (int g = 0; g < n_reg && n_reg == l->n_reg; g++) {
        int64_t from = (int64_t)g * l->stride, to = (int64_t)g * stride, k = l->cnt[g], b = l->blind[g];
        memcpy(rec + to, l->rec + from, sizeof *rec * (size_t)k);
        memcpy(seen + to + b, l->seen + from + b, sizeof *seen * (size_t)(k - b));   /* blind entries hold nothing */
        memcpy(host + to + b, l->host + from + b, sizeof *host * (size_t)(k - b));
    }
    free(l->seen);
    free(l->rec);
    free(l->host);
    l->seen = seen;
    l->rec = rec;
    l->host = host;
    l->stride = stride;
    l->n_reg = n_reg;
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

/* Queue region g's entries [j0, j1) of the host descriptors for the device, at their offset hp_g. */
static int send_run(pt_set *s, pt_list *l, int g, int64_t hp_g, int64_t j0, int64_t j1)
{
    if (j1 <= j0) return PT_OK;
    return ub_add(s->batch, l->dev + hp_g + j0, l->host + (int64_t)g * l->stride + j0,
                  sizeof(ag_page) * (size_t)(j1 - j0))
               ? PT_NO_HOST_MEMORY
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

/* Record entry m (region g's entry j, j < cnt[g] when it holds one) is to be pg: left as it is when
 * its descriptor still holds, else built (pc_get sends the page's new rows). counted: j < cnt[g],
 * the entry holds the copy it names (pc_hold), whether or not the record is trusted (had); an entry
 * past cnt[g] holds its copy once the call ends (pt_build). *send: its descriptor differs from the
 * one the record had, and must go to the device. */
static int do_entry(pt_set *s, pt_list *l, int64_t m, int had, int counted, const be_kv_page *pg,
                    const pt_direct *direct, size_t *w, int *send)
{
    int keep = had && l->rec[m] != PT_REBUILD && same_page(pg, &l->seen[m]) &&
               (l->rec[m] == PT_DIRECT || pg->n <= 0 || pc_current(s->copies, l->rec[m], pg, l->host[m].k));
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
    l->seen[m] = *pg;
    if (counted) {   /* the new copy held before the old one is let go: a copy both name stays held */
        pc_hold(s->copies, rec, 1);
        pc_hold(s->copies, l->rec[m], -1);
    }
    l->rec[m] = rec;
    if (!had || !same_desc(&d, &l->host[m])) {
        if (had) count_entry(l, &l->host[m], -1);
        count_entry(l, &d, 1);
        l->host[m] = d;
        *send = 1;
    }
    return PT_OK;
}

/* Region g's entries [j0, j1) (list[hp_g + j], the device's entry hp_g + j) through do_entry: the
 * record held its first had of them, and the device holds the descriptors of its first on_dev
 * there; the descriptors that must go to the device are queued in runs. */
static int do_range(pt_set *s, pt_list *l, int g, const be_kv_page *list, int64_t hp_g, int64_t j0, int64_t j1,
                    int64_t had, int64_t on_dev, const pt_direct *direct, size_t *w)
{
    int64_t run0 = -1;   /* the first entry of the run of descriptors to send, -1: none open */
    for (int64_t j = j0; j < j1; j++) {
        int send = j >= on_dev;   /* the device's entry holds some other descriptor */
        int rc = do_entry(s, l, (int64_t)g * l->stride + j, j < had, j < l->cnt[g], &list[hp_g + j], direct, w, &send);
        if (rc != PT_OK) return rc;
        if (send) {
            if (run0 < 0) run0 = j;
            continue;
        }
        /* entry j is on the device as it should be: the open run ends before it */
        if (run0 >= 0 && (rc = send_run(s, l, g, hp_g, run0, j)) != PT_OK) return rc;
        run0 = -1;
    }
    return run0 >= 0 ? send_run(s, l, g, hp_g, run0, j1) : PT_OK;
}

/* Whether a call under shape with offsets hp only appends to l as l stands (the same name, shape
 * and heads; a list whose array must grow is built whole): stable[g], head g's entries that are as
 * the last call left them (its pages before its last one), wherever the offsets put them now. */
static int appends(const pt_list *l, uint64_t shape, const int64_t *hp, int n_heads, int64_t *stable)
{
    int appended = shape != 0 && shape == l->shape && hp && l->n_hp == n_heads + 1 && l->n > 0 &&
                   hp[n_heads] <= l->cap;
    for (int g = 0; appended && g < n_heads; g++) {
        stable[g] = l->pages_of[g] - 1;   /* the last page may have grown */
        if (stable[g] > hp[g + 1] - hp[g]) appended = 0;   /* not an append after all */
        if (l->blind[g] > 0 && stable[g] < l->blind[g]) appended = 0;   /* it would read what a clone did not copy */
    }
    /* a clone's moved heads go from array to array on the device (pt_clone made the second): from
     * its record they could not (pt_reads_from and pt_build must agree on what a call reads) */
    if (appended && !l->dev_alt && has_blind(l) && memcmp(l->hp, hp, sizeof(int64_t) * (size_t)(n_heads + 1)))
        appended = 0;
    return appended;
}

/* The heads' descriptors moved on the device from the offsets it has (l->hp) to hp: head g's first
 * keep[g] from the list's array into its other one, which becomes the list's. What the batch held
 * is sent first (the moves read the array it may write); what is queued after them must not write
 * where they do (an append's: each head's entries past keep[g]). on_dev[g]: the descriptors head g
 * then has in place. No room on the device for the second array: the moved heads' descriptors are
 * sent from the host's record instead, into the list's array at their new places. */
static int move_heads(pt_set *s, pt_list *l, const int64_t *hp, int n_heads, const int64_t *keep, int64_t *on_dev)
{
    if (!l->dev_alt && (l->dev_alt = s->dev.alloc(s->dev.ud, dev_bytes(l->cap))) != NULL) s->bytes += dev_bytes(l->cap);
    if (ub_flush(s->batch)) return PT_NO_HOST_MEMORY;   /* what it queued lands before anything below */
    l->n_hp = -1;   /* the offsets go again (into the new array) */
    for (int g = 0; g < n_heads; g++) {
        on_dev[g] = keep[g] > 0 ? keep[g] : 0;
        if (!l->dev_alt) {
            if (l->hp[g] != hp[g] && send_run(s, l, g, hp[g], 0, on_dev[g]) != PT_OK) return PT_NO_HOST_MEMORY;
            continue;
        }
        if (on_dev[g] && ub_add_dev(s->batch, l->dev_alt + hp[g], l->dev + l->hp[g], sizeof(ag_page) * (size_t)on_dev[g]))
            return PT_NO_HOST_MEMORY;
        s->moved += (uint64_t)on_dev[g];
    }
    if (!l->dev_alt) return PT_OK;
    ag_page *t = l->dev;
    l->dev = l->dev_alt;
    l->dev_alt = t;
    return PT_OK;
}

static pt_list *peek_list(const pt_set *s, uint64_t name)
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
    if (!l || !appends(l, shape, hp, n_heads, stable)) return 0;
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

int pt_clone(pt_set *s, uint64_t name, uint64_t from)
{
    pt_list *src = peek_list(s, from);
    if (name == from || !src || src->n <= 0 || src->n_hp < 2 || src->n_reg != src->n_hp - 1 || peek_list(s, name))
        return PT_OK;
    pt_list *l = find_list(s, name);   /* may move every list: src found again */
    if (!l) return PT_OK;
    src = peek_list(s, from);
    const int n_reg = src->n_reg;
    const size_t c = (size_t)n_reg * (size_t)src->stride;
    /* room past the source's entries: its array may be full, and a fork's first call adds its own
     * rows (and maybe a page) to every head; an array that grows is sent whole */
    const int64_t cap = src->cap > src->n + src->n / 4 + 64 ? src->cap : src->n + src->n / 4 + 64;
    /* and its second array now: a fork's first call moves its heads (its own rows after each head's
     * pages, fewer than a prompt chunk's), which a clone's record cannot send */
    ag_page *dev = s->dev.alloc(s->dev.ud, dev_bytes(cap)), *alt = dev ? s->dev.alloc(s->dev.ud, dev_bytes(cap)) : NULL;
    be_kv_page *seen = malloc(sizeof *seen * c);   /* written only past each head's blind entries */
    int32_t *rec = malloc(sizeof *rec * c);
    ag_page *host = malloc(sizeof *host * c);
    int rc = PT_OK;
    if (dev && alt && seen && rec && host) {
        /* what the batch holds may write the source's array: sent before the copy reads it */
        if ((s->batch->n && ub_flush(s->batch)) ||
            ub_add_dev(s->batch, dev, src->dev, sizeof(ag_page) * (size_t)src->n) ||
            ub_add_dev(s->batch, dev + cap, src->dev + src->cap, sizeof(int64_t) * (size_t)src->n_hp))
            rc = PT_NO_HOST_MEMORY;
        else {
            l->dev = dev;
            l->dev_alt = alt;
            l->cap = cap;
            s->bytes += 2 * dev_bytes(l->cap);
            l->seen = seen;
            l->rec = rec;
            l->host = host;
            l->stride = src->stride;
            l->n_reg = n_reg;
            l->shape = src->shape;
            l->n = src->n;
            l->n_hp = src->n_hp;
            l->n_bias = src->n_bias;
            l->n_unaligned = src->n_unaligned;
            memcpy(l->hp, src->hp, sizeof l->hp);
            memcpy(l->pages_of, src->pages_of, sizeof l->pages_of);
            for (int g = 0; g < n_reg; g++) {
                const int64_t at = (int64_t)g * l->stride, k = src->cnt[g];
                int64_t b = src->pages_of[g] - 1;   /* what an append reads from on */
                b = b < src->blind[g] ? src->blind[g] : b;
                b = b < 0 ? 0 : b > k ? k : b;
                memcpy(rec + at, src->rec + at, sizeof *rec * (size_t)k);
                memcpy(seen + at + b, src->seen + at + b, sizeof *seen * (size_t)(k - b));
                memcpy(host + at + b, src->host + at + b, sizeof *host * (size_t)(k - b));
                l->cnt[g] = k;
                l->blind[g] = b;
                hold_range(s, l, g, 0, k, 1);
            }
            l->last_use = s->calls;
            src->last_use = s->calls;   /* a source forks still copy stays as a used list */
            s->cloned += (uint64_t)l->n;
            s->clone_unsent = 1;
            return PT_OK;
        }
    }
    if (dev) s->dev.release(s->dev.ud, dev);
    if (alt) s->dev.release(s->dev.ud, alt);
    free(seen);
    free(rec);
    free(host);
    return rc;   /* the list stays as find_list made it: empty, built whole at its first call */
}

int pt_build(pt_set *s, uint64_t name, uint64_t shape, const be_kv_page *list, int64_t e, const int64_t *hp,
             int n_heads, const pt_direct *direct, pt_call *out)
{
    memset(out, 0, sizeof *out);
    if (n_heads < 0 || n_heads > PT_MAX_HEADS || (hp && (n_heads < 1 || hp[0] != 0 || hp[n_heads] != e)))
        return PT_BAD_LIST;
    for (int g = 0; hp && g < n_heads; g++)
        if (hp[g + 1] < hp[g]) return PT_BAD_LIST;
    if (s->clone_unsent) {   /* a clone's copy lands before any list is written */
        s->clone_unsent = 0;
        if (ub_flush(s->batch)) return PT_NO_HOST_MEMORY;
    }
    s->calls++;
    pt_list *l = find_list(s, name);
    if (!l) return PT_NO_HOST_MEMORY;
    l->last_use = s->calls;
    /* the regions: a head each, or the whole list as one */
    const int n_reg = hp ? n_heads : 1;
    const int64_t whole[2] = { 0, e };
    const int64_t *at = hp ? hp : whole;
    int64_t most = 1;
    for (int g = 0; g < n_reg; g++)
        if (at[g + 1] - at[g] > most) most = at[g + 1] - at[g];
    int64_t stable[PT_MAX_HEADS], on_dev[PT_MAX_HEADS];
    int appended = appends(l, shape, hp, n_heads, stable);
    if (!appended && has_blind(l)) {   /* a clone's record lacks its heads' early entries: built whole */
        release_record(s, l);
        l->n = 0;
    }
    int rc = grow_list(s, l, e > 0 ? e : 1);
    if (rc == PT_OK) rc = fit_record(s, l, n_reg, most);
    if (rc != PT_OK) return rc;
    /* what the device holds where this call's offsets put it. Where they moved under an append,
     * the heads' stable descriptors are moved there (nothing queued after them writes where they
     * do); a list that is not an append (a selection's, rebuilt every step: tens of entries a head)
     * sends the descriptors of every head whose offset moved instead of two more sends a call */
    const int valid = l->n > 0 && (hp ? l->n_hp == n_heads + 1 : l->n_hp == -1);
    for (int g = 0; g < n_reg; g++) on_dev[g] = valid ? l->cnt[g] : 0;
    if (valid && hp && memcmp(l->hp, hp, sizeof(int64_t) * (size_t)(n_heads + 1)) != 0) {
        if (appended) {
            rc = move_heads(s, l, hp, n_heads, stable, on_dev);
            if (rc != PT_OK) return rc;
        } else {
            for (int g = 0; g < n_heads; g++)
                if (l->hp[g] != hp[g]) on_dev[g] = 0;
        }
    }
    size_t w = 0;
    for (int g = 0; g < n_reg && rc == PT_OK; g++) {
        int64_t j0 = appended && stable[g] > 0 ? stable[g] : 0, had = l->n > 0 ? l->cnt[g] : 0, now = at[g + 1] - at[g];
        s->kept += (uint64_t)j0;
        for (int64_t j = now; appended && j < had; j++)   /* entries gone from the head's end (rows taken since) */
            count_entry(l, &l->host[(int64_t)g * l->stride + j], -1);
        rc = do_range(s, l, g, list, at[g], j0, now, had, on_dev[g], direct, &w);
    }
    if (rc == PT_OK && !appended) {   /* counted afresh, the entries past each region's end gone */
        l->n_bias = l->n_unaligned = 0;
        for (int g = 0; g < n_reg; g++)
            for (int64_t j = 0; j < at[g + 1] - at[g]; j++) count_entry(l, &l->host[(int64_t)g * l->stride + j], 1);
    }
    if (rc != PT_OK) {
        l->n = 0;   /* the record is part-built: nothing of it is trusted */
        return rc;
    }
    for (int g = 0; g < n_reg; g++) {   /* entries past the old count now hold, those past the new let go */
        const int64_t now = at[g + 1] - at[g];
        if (now > l->cnt[g]) hold_range(s, l, g, l->cnt[g], now, 1);
        else hold_range(s, l, g, now, l->cnt[g], -1);
        l->cnt[g] = now;
    }
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
    /* the copies' idle sweep is next: lists unused as long go first, letting go of their copies
     * (the copies a live list holds are kept without a look at its entries: pc_hold) */
    if ((c->calls + 1) % c->idle == 0) pt_trim(s, idle);
    pc_begin_call(c);
}
