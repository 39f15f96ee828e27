/* page_list.c - a layer's list of every page, kept from call to call (page_list.h). */
#include "engine/page_list.h"

#include <stdlib.h>
#include <string.h>

void page_list_ref(be_kv_page *r, const kv_page *p, const uint64_t *mask, int head_dim, int page_size)
{
    r->k = p->k;
    r->v = p->v;
    r->pos = p->pos;
    r->bias = p->merged ? p->logdeg : NULL;
    r->mask = mask;
    r->n = p->n;
    r->stride = head_dim;
    r->head_step = 0;
    r->gen = p->gen;
    r->cap = page_size;
    r->ksum = p->ksum;
}

int page_list_update(page_list *L, const kv_cache *kv, int il)
{
    int Hkv = kv_n_head_kv(kv), P = kv_page_size(kv), D = (int)kv_head_dim(kv);
    uint64_t shape = kv_layer_shape(kv, il);
    int64_t need = 0, cnt[PAGE_LIST_MAX_HEADS];
    if (Hkv > PAGE_LIST_MAX_HEADS) goto fail;
    for (int h = 0; h < Hkv; h++) {
        cnt[h] = kv_n_pages(kv, il, h);
        need += cnt[h];
    }
    int append = L->shape == shape;
    for (int h = 0; h < Hkv && append; h++)
        if (cnt[h] < L->off[h + 1] - L->off[h]) append = 0;   /* cannot be while the shape holds */
    if (need > L->cap) {
        int64_t nc = need * 2 > 64 ? need * 2 : 64;
        be_kv_page *r = realloc(L->refs, sizeof *r * (size_t)nc);   /* the entries stay */
        if (!r) goto fail;
        L->refs = r;
        L->cap = nc;
    }
    if (append) {
        int64_t off[PAGE_LIST_MAX_HEADS + 1];
        off[0] = 0;
        for (int h = 0; h < Hkv; h++) off[h + 1] = off[h] + cnt[h];
        /* offsets only grow: move the heads up, the last first, so none overwrites one not moved */
        for (int h = Hkv - 1; h >= 0; h--)
            if (off[h] != L->off[h])
                memmove(L->refs + off[h], L->refs + L->off[h], sizeof *L->refs * (size_t)(L->off[h + 1] - L->off[h]));
        for (int h = 0; h < Hkv; h++) {
            int64_t was = L->off[h + 1] - L->off[h];
            for (int64_t j = was > 0 ? was - 1 : 0; j < cnt[h]; j++)
                page_list_ref(&L->refs[off[h] + j], kv_layer_page(kv, il, h, (int)j), NULL, D, P);
        }
        memcpy(L->off, off, sizeof(int64_t) * (size_t)(Hkv + 1));
    } else {
        int64_t e = 0;
        for (int h = 0; h < Hkv; h++) {
            L->off[h] = e;
            for (int j = 0; j < cnt[h]; j++) page_list_ref(&L->refs[e++], kv_layer_page(kv, il, h, j), NULL, D, P);
        }
        L->off[Hkv] = e;
    }
    L->shape = shape;
    return 0;
fail:
    L->shape = 0;
    memset(L->off, 0, sizeof L->off);
    return -1;
}

void page_list_free(page_list *L)
{
    free(L->refs);
    memset(L, 0, sizeof *L);
}
