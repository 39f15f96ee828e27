/* bytes.h - a growable byte buffer to serialize into and a bounds-checked cursor to read back from,
 * for snapshots. Values are stored in the host's byte order (little-endian on every platform kvchat
 * builds for); the snapshot header records it. A read past the end, or an allocation failure, sets
 * the sticky error flag and every later call is a no-op, so callers check once at the end. */
#ifndef KVCHAT_BYTES_H
#define KVCHAT_BYTES_H

#include <stddef.h>
#include <stdint.h>

typedef struct bytes_w {
    uint8_t *p;
    size_t n, cap;
    int err;
} bytes_w;

typedef struct bytes_r {
    const uint8_t *p;
    size_t n, off;
    int err;
} bytes_r;

void bw_put(bytes_w *w, const void *src, size_t n);
void bw_u32(bytes_w *w, uint32_t v);
void bw_i64(bytes_w *w, int64_t v);
void bw_f64(bytes_w *w, double v);
void bw_str(bytes_w *w, const char *s);   /* u32 length, then the bytes */
void bw_free(bytes_w *w);

/* Copy n bytes out (dst may be NULL to skip). 0, or -1 (and err set) when fewer remain. */
int br_get(bytes_r *r, void *dst, size_t n);
uint32_t br_u32(bytes_r *r);
int64_t br_i64(bytes_r *r);
double br_f64(bytes_r *r);
/* A string into dst (NUL-terminated); err when longer than cap - 1 or past the end. */
void br_str(bytes_r *r, char *dst, size_t cap);
/* A pointer to the next n bytes without copying (NULL and err when fewer remain). */
const void *br_view(bytes_r *r, size_t n);

#endif
