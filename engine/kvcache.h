/* kvcache.h - the per-layer key/value cache behind a narrow interface.
 *
 * Today: one contiguous f32 slab per layer, indexed by position, reserved with mmap so untouched
 * context costs no memory. The forward pass only appends rows (kv_k_row/kv_v_row at the next
 * positions), reads the slabs for attention, and commits or rewinds the length; the paged cache
 * replaces these insides without changing that contract. */
#ifndef KVCHAT_KVCACHE_H
#define KVCHAT_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct kv_cache kv_cache;

kv_cache *kv_create(int n_layer, int64_t n_ctx, int64_t row_dim, char *err, size_t errlen);
void kv_free(kv_cache *kv);

int64_t kv_n_ctx(const kv_cache *kv);
int64_t kv_len(const kv_cache *kv);            /* committed positions */
void kv_set_len(kv_cache *kv, int64_t n);      /* commit after a chunk, or rewind (n <= len) */

/* Row of layer il at position pos (pos < n_ctx): row_dim floats. */
float *kv_k_row(kv_cache *kv, int il, int64_t pos);
float *kv_v_row(kv_cache *kv, int il, int64_t pos);
const float *kv_k_base(const kv_cache *kv, int il);
const float *kv_v_base(const kv_cache *kv, int il);

/* Bytes the committed positions occupy, and the largest that has been touched (the peak). */
uint64_t kv_bytes_used(const kv_cache *kv);
uint64_t kv_bytes_peak(const kv_cache *kv);

#endif
