/* act_mirror.c - device twins of activation buffers and who holds their newest bytes (act_mirror.h). */
#include "kernels/act_mirror.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void am_init(am_table *t, const am_device *dev)
{
    memset(t, 0, sizeof *t);
    t->dev = *dev;
}

static void wait_device(am_table *t);

void am_free(am_table *t)
{
    for (int i = 0; i < t->n; i++)
        if (t->b[i].down_pending) {   /* a copy in flight into a buffer its owner may free next */
            wait_device(t);
            break;
        }
    for (int i = 0; i < t->n; i++) {
        if (t->b[i].pinned) t->dev.pin(t->dev.ud, t->b[i].host, t->b[i].bytes, 0);
        t->dev.release(t->dev.ud, t->b[i].dev);
    }
    free(t->b);
    memset(t, 0, sizeof *t);
}

static am_buf *find(const am_table *t, const void *p, size_t bytes);

int am_pinned(const am_table *t, const void *p, size_t bytes)
{
    const am_buf *b = find(t, p, bytes);
    return b && b->pinned;
}

/* The buffer holding [p, p + bytes), or NULL when no buffer overlaps it. A buffer is found by
 * scanning: the forward pass binds about ten. */
static am_buf *find(const am_table *t, const void *p, size_t bytes)
{
    const char *c = p;
    for (int i = 0; i < t->n; i++) {
        am_buf *b = &t->b[i];
        if (c >= b->host && c < b->host + b->bytes) {
            if (bytes > (size_t)(b->host + b->bytes - c)) {
                fprintf(stderr, "kvchat: internal error: a %zu-byte range runs past the end of a bound buffer\n",
                        bytes);
                abort();
            }
            return b;
        }
        if (c < b->host && bytes > (size_t)(b->host - c)) {
            fprintf(stderr, "kvchat: internal error: a %zu-byte range starts before a bound buffer\n", bytes);
            abort();
        }
    }
    return NULL;
}

static int bind(am_table *t, void *host, size_t bytes, int blank, int pin)
{
    if (bytes == 0 || find(t, host, bytes)) return -1;
    if (t->n == t->cap) {
        int nc = t->cap ? t->cap * 2 : 16;
        am_buf *nb = realloc(t->b, sizeof *nb * (size_t)nc);
        if (!nb) return -1;
        t->b = nb;
        t->cap = nc;
    }
    void *d = t->dev.alloc(t->dev.ud, bytes);
    if (!d) return -1;
    /* Nothing is on the device yet: the whole buffer is newer on the host, uploaded at first use
     * (a blank buffer's bytes mean nothing yet: neither copy is newer) */
    t->b[t->n++] = (am_buf){ .host = host, .dev = d, .bytes = bytes, .hlo = 0, .hhi = blank ? 0 : bytes,
                             .pinned = 0 };
    t->bytes += bytes;
    t->dev_changes++;
    if (pin && t->dev.pin) t->b[t->n - 1].pinned = t->dev.pin(t->dev.ud, host, bytes, 1) == 0;
    return 0;
}

int am_bind(am_table *t, void *host, size_t bytes) { return bind(t, host, bytes, 0, 1); }

int am_bind_blank(am_table *t, void *host, size_t bytes, int pin) { return bind(t, host, bytes, 1, pin); }

void am_unbind(am_table *t, void *host)
{
    for (int i = 0; i < t->n; i++) {
        if (t->b[i].host != host) continue;
        if (t->b[i].down_pending) wait_device(t);   /* a copy in flight into memory about to be freed */
        if (t->b[i].pinned) t->dev.pin(t->dev.ud, host, t->b[i].bytes, 0);
        t->dev.release(t->dev.ud, t->b[i].dev);
        t->bytes -= t->b[i].bytes;
        t->dev_changes++;
        t->b[i] = t->b[--t->n];
        return;
    }
}

int am_bound(const am_table *t, const void *p, size_t bytes) { return find(t, p, bytes) != NULL; }

static void upload_host_newer(am_table *t, am_buf *b)
{
    if (b->hlo >= b->hhi) return;
    t->dev.upload(t->dev.ud, b->dev + b->hlo, b->host + b->hlo, b->hhi - b->hlo);
    t->up_bytes += b->hhi - b->hlo;
    t->dev_changes++;
    b->hlo = b->hhi = 0;
    b->up_pending = 1;
}

/* What of [dlo, dhi) the host now holds too: the interval shrinks when [a, e) covers one of its ends
 * (a hole in the middle cannot be expressed, so those bytes stay marked; copying them again is
 * harmless). */
static void settled(am_buf *b, size_t a, size_t e)
{
    if (a <= b->dlo && e >= b->dhi) b->dlo = b->dhi = 0;
    else if (a <= b->dlo && e > b->dlo) b->dlo = e;
    else if (e >= b->dhi && a < b->dhi) b->dhi = a;
}

void am_waited(am_table *t)
{
    for (int i = 0; i < t->n; i++) {
        am_buf *b = &t->b[i];
        b->up_pending = b->down_pending = 0;
        if (b->flo < b->fhi) {
            settled(b, b->flo, b->fhi);
            if (b->flo > b->dlo && b->fhi < b->dhi) {   /* a hole: remembered apart */
                b->clo = b->flo;
                b->chi = b->fhi;
            }
        }
        b->flo = b->fhi = 0;
    }
}

static void wait_device(am_table *t)
{
    t->dev.wait(t->dev.ud);
    t->waits++;
    am_waited(t);
}

const void *am_dev_in(am_table *t, const void *p, size_t bytes)
{
    am_buf *b = find(t, p, bytes);
    if (!b) return NULL;
    upload_host_newer(t, b);
    return b->dev + ((const char *)p - b->host);
}

void *am_dev_out(am_table *t, void *p, size_t bytes)
{
    am_buf *b = find(t, p, bytes);
    if (!b) return NULL;
    upload_host_newer(t, b);
    size_t lo = (size_t)((char *)p - b->host), hi = lo + bytes;
    t->dev_changes++;
    b->flo = b->fhi = 0;   /* a fetch in flight would bring back bytes this op replaces */
    b->clo = b->chi = 0;
    if (bytes > 0) {
        if (b->dlo >= b->dhi) {
            b->dlo = lo;
            b->dhi = hi;
        } else {
            if (lo < b->dlo) b->dlo = lo;
            if (hi > b->dhi) b->dhi = hi;
        }
    }
    return b->dev + lo;
}

void am_host_read(am_table *t, const am_range *r, int n)
{
    int copied = 0;
    for (int i = 0; i < n; i++) {
        am_buf *b = find(t, r[i].p, r[i].bytes);
        if (!b || b->dlo >= b->dhi) continue;
        size_t lo = (size_t)((const char *)r[i].p - b->host), hi = lo + r[i].bytes;
        size_t a = lo > b->dlo ? lo : b->dlo, e = hi < b->dhi ? hi : b->dhi;
        if (a >= e) continue;
        if (a >= b->clo && e <= b->chi) continue;   /* fetched, and in */
        if (a >= b->flo && e <= b->fhi) {   /* fetched already: the wait below brings it in */
            copied = 1;
            continue;
        }
        t->dev.download(t->dev.ud, b->host + a, b->dev + a, e - a);
        t->down_bytes += e - a;
        copied = 1;
        settled(b, a, e);
    }
    if (copied) wait_device(t);
}

void am_host_prefetch(am_table *t, const am_range *r, int n)
{
    for (int i = 0; i < n; i++) {
        am_buf *b = find(t, r[i].p, r[i].bytes);
        if (!b || b->dlo >= b->dhi || b->down_pending) continue;
        size_t lo = (size_t)((const char *)r[i].p - b->host), hi = lo + r[i].bytes;
        size_t a = lo > b->dlo ? lo : b->dlo, e = hi < b->dhi ? hi : b->dhi;
        if (a >= e) continue;
        t->dev.download(t->dev.ud, b->host + a, b->dev + a, e - a);
        t->down_bytes += e - a;
        b->flo = a;
        b->fhi = e;
        b->down_pending = 1;
    }
}

void am_host_write(am_table *t, void *p, size_t bytes)
{
    am_buf *b = find(t, p, bytes);
    if (!b || bytes == 0) return;
    size_t lo = (size_t)((char *)p - b->host), hi = lo + bytes;
    int copied = 0;
    if (b->dlo < b->dhi) {
        /* bytes newer on the device that the write leaves alone must reach the host first: what
         * lies below and above the written range */
        if (b->dlo < lo) {
            size_t e = b->dhi < lo ? b->dhi : lo;
            t->dev.download(t->dev.ud, b->host + b->dlo, b->dev + b->dlo, e - b->dlo);
            t->down_bytes += e - b->dlo;
            copied = 1;
        }
        if (b->dhi > hi) {
            size_t a = b->dlo > hi ? b->dlo : hi;
            t->dev.download(t->dev.ud, b->host + a, b->dev + a, b->dhi - a);
            t->down_bytes += b->dhi - a;
            copied = 1;
        }
        b->dlo = b->dhi = 0;
        b->clo = b->chi = 0;
    }
    /* a copy still in flight to or from this buffer would race with the write */
    if (copied || b->up_pending || b->down_pending) wait_device(t);
    if (b->hlo >= b->hhi) {
        b->hlo = lo;
        b->hhi = hi;
    } else {
        if (lo < b->hlo) b->hlo = lo;
        if (hi > b->hhi) b->hhi = hi;
    }
}
