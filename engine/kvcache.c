/* kvcache.c - contiguous per-layer K/V slabs (see kvcache.h).
 *
 * Address space for n_ctx positions is reserved up front with an anonymous mapping; the kernel only
 * backs the pages that are written, so the resident size grows with the conversation, not with the
 * context limit. */
#include "kvcache.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

struct kv_cache {
    int n_layer;
    int64_t n_ctx;
    int64_t row_dim;
    int64_t len;
    int64_t high;          /* highest position count ever held (peak) */
    float *slab;           /* [n_layer][2][n_ctx][row_dim] */
    size_t slab_bytes;
};

kv_cache *kv_create(int n_layer, int64_t n_ctx, int64_t row_dim, char *err, size_t errlen)
{
    kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    kv->n_layer = n_layer;
    kv->n_ctx = n_ctx;
    kv->row_dim = row_dim;
    size_t bytes;
    if (__builtin_mul_overflow((size_t)n_layer * 2u, (size_t)n_ctx, &bytes) ||
        __builtin_mul_overflow(bytes, (size_t)row_dim * sizeof(float), &bytes)) {
        snprintf(err, errlen, "KV cache size overflows");
        free(kv);
        return NULL;
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        snprintf(err, errlen, "cannot reserve %zu bytes for the KV cache: %s", bytes, strerror(errno));
        free(kv);
        return NULL;
    }
    kv->slab = p;
    kv->slab_bytes = bytes;
    return kv;
}

void kv_free(kv_cache *kv)
{
    if (!kv) return;
    if (kv->slab) munmap(kv->slab, kv->slab_bytes);
    free(kv);
}

int64_t kv_n_ctx(const kv_cache *kv) { return kv->n_ctx; }
int64_t kv_len(const kv_cache *kv) { return kv->len; }

void kv_set_len(kv_cache *kv, int64_t n)
{
    kv->len = n;
    if (n > kv->high) kv->high = n;
}

static float *layer_base(const kv_cache *kv, int il, int which)
{
    return kv->slab + ((size_t)il * 2 + (size_t)which) * (size_t)kv->n_ctx * (size_t)kv->row_dim;
}

float *kv_k_row(kv_cache *kv, int il, int64_t pos) { return layer_base(kv, il, 0) + pos * kv->row_dim; }
float *kv_v_row(kv_cache *kv, int il, int64_t pos) { return layer_base(kv, il, 1) + pos * kv->row_dim; }
const float *kv_k_base(const kv_cache *kv, int il) { return layer_base(kv, il, 0); }
const float *kv_v_base(const kv_cache *kv, int il) { return layer_base(kv, il, 1); }

uint64_t kv_bytes_used(const kv_cache *kv)
{
    return (uint64_t)kv->len * (uint64_t)kv->row_dim * sizeof(float) * 2u * (uint64_t)kv->n_layer;
}

uint64_t kv_bytes_peak(const kv_cache *kv)
{
    return (uint64_t)kv->high * (uint64_t)kv->row_dim * sizeof(float) * 2u * (uint64_t)kv->n_layer;
}
