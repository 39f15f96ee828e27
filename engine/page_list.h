/* page_list.h - a layer's list of every page its KV heads hold, as the backend's ops read one
 * (be_kv_page descriptors, per-head offsets), kept from call to call.
 *
 * While the cache's layer shape (kv_layer_shape) stays the same, only each head's last page and the
 * pages after it are new, so an update rewrites a few entries a head instead of every page. The
 * forward pass keeps one a layer for attention; CHESS one a global layer for its summaries. */
#ifndef KVCHAT_PAGE_LIST_H
#define KVCHAT_PAGE_LIST_H

#include <stdint.h>

#include "engine/kvcache.h"
#include "kernels/backend.h"

#define PAGE_LIST_MAX_HEADS 64

typedef struct page_list {
    be_kv_page *refs;
    int64_t cap;
    int64_t off[PAGE_LIST_MAX_HEADS + 1];   /* head h's entries: refs[off[h] .. off[h + 1]) */
    uint64_t shape;   /* the layer shape at the last update; 0: nothing built */
} page_list;

/* The descriptor of page p (mask NULL: every token) as the ops read it. */
void page_list_ref(be_kv_page *r, const kv_page *p, const uint64_t *mask, int head_dim, int page_size);
/* L brought up to date with layer il of kv: built whole when the layer's shape changed, else each
 * head's last page and those after it (the heads' entries moved up where a head gained pages). 0,
 * or -1 when out of memory (or more than PAGE_LIST_MAX_HEADS heads), L then empty. */
int page_list_update(page_list *L, const kv_cache *kv, int il);
void page_list_free(page_list *L);

#endif
