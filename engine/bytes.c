/* bytes.c - serialization buffer and checked reader. */
#include "engine/bytes.h"

#include <stdlib.h>
#include <string.h>

void bw_put(bytes_w *w, const void *src, size_t n)
{
    if (w->err || n == 0) return;
    if (w->n + n > w->cap) {
        size_t nc = w->cap ? w->cap : 4096;
        while (nc < w->n + n) nc *= 2;
        uint8_t *np = realloc(w->p, nc);
        if (!np) {
            w->err = 1;
            return;
        }
        w->p = np;
        w->cap = nc;
    }
    memcpy(w->p + w->n, src, n);
    w->n += n;
}

void bw_u32(bytes_w *w, uint32_t v) { bw_put(w, &v, sizeof v); }
void bw_i64(bytes_w *w, int64_t v) { bw_put(w, &v, sizeof v); }
void bw_f64(bytes_w *w, double v) { bw_put(w, &v, sizeof v); }

void bw_str(bytes_w *w, const char *s)
{
    size_t n = s ? strlen(s) : 0;
    bw_u32(w, (uint32_t)n);
    bw_put(w, s, n);
}

void bw_free(bytes_w *w)
{
    free(w->p);
    memset(w, 0, sizeof *w);
}

int br_get(bytes_r *r, void *dst, size_t n)
{
    if (r->err || n > r->n - r->off) {
        r->err = 1;
        if (dst && n) memset(dst, 0, n);
        return -1;
    }
    if (dst) memcpy(dst, r->p + r->off, n);
    r->off += n;
    return 0;
}

uint32_t br_u32(bytes_r *r)
{
    uint32_t v = 0;
    br_get(r, &v, sizeof v);
    return v;
}

int64_t br_i64(bytes_r *r)
{
    int64_t v = 0;
    br_get(r, &v, sizeof v);
    return v;
}

double br_f64(bytes_r *r)
{
    double v = 0;
    br_get(r, &v, sizeof v);
    return v;
}

void br_str(bytes_r *r, char *dst, size_t cap)
{
    uint32_t n = br_u32(r);
    dst[0] = 0;
    if (r->err) return;
    if ((size_t)n >= cap) {
        r->err = 1;
        return;
    }
    if (br_get(r, dst, n) == 0) dst[n] = 0;
}

const void *br_view(bytes_r *r, size_t n)
{
    if (r->err || n > r->n - r->off) {
        r->err = 1;
        return NULL;
    }
    const void *p = r->p + r->off;
    r->off += n;
    return p;
}
