/* attn_rows.c - a deferred decode step's own K/V rows as one more page per KV head (backend.h). */
#include "kernels/backend.h"

#include <string.h>

static void list_of(const be_attn *a, int g, int64_t *p0, int64_t *p1)
{
    *p0 = a->head_pages ? a->head_pages[g] : 0;
    *p1 = a->head_pages ? a->head_pages[g + 1] : a->n_pages;
}

int64_t be_attn_rows_len(const be_attn *a)
{
    int64_t n = 0;
    for (int g = 0; g < a->n_head_kv; g++) {
        int64_t p0, p1;
        list_of(a, g, &p0, &p1);
        n += p1 - p0 + 1;
    }
    return n;
}

int64_t be_attn_rows_list(const be_attn *a, const uint16_t *k16, const uint16_t *v16, const int32_t *pos,
                          be_kv_page *out, int64_t *hp)
{
    int64_t e = 0, kvd = (int64_t)a->n_head_kv * a->head_dim;
    for (int g = 0; g < a->n_head_kv; g++) {
        int64_t p0, p1;
        list_of(a, g, &p0, &p1);
        hp[g] = e;
        if (p1 > p0) memcpy(out + e, a->pages + p0, sizeof(be_kv_page) * (size_t)(p1 - p0));
        e += p1 - p0;
        out[e++] = (be_kv_page){ .k = k16, .v = v16, .pos = pos, .n = (int32_t)a->n_cur, .stride = (int32_t)kvd,
                                 .head_step = a->head_dim };
    }
    hp[a->n_head_kv] = e;
    return e;
}
