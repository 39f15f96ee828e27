/* attn_rows.c - rows not in the cache yet (a deferred decode step's, or a prefill chunk's) as more
 * pages per KV head, and a selection made by bounds as the list it stands for (backend.h). */
#include "kernels/backend.h"

#include "kernels/attn_group.h"
#include "kernels/segment_kernels.h"

#include <string.h>

static void list_of(const be_attn *a, int g, int64_t *p0, int64_t *p1)
{
    *p0 = a->head_pages ? a->head_pages[g] : 0;
    *p1 = a->head_pages ? a->head_pages[g + 1] : a->n_pages;
}

static int64_t pieces(const be_attn *a) { return a->n_cur > 0 ? (a->n_cur + BE_CUR_ROWS - 1) / BE_CUR_ROWS : 0; }

int64_t be_attn_rows_len(const be_attn *a)
{
    int64_t n = 0;
    for (int g = 0; g < a->n_head_kv; g++) {
        int64_t p0, p1;
        list_of(a, g, &p0, &p1);
        n += p1 - p0 + pieces(a);
    }
    return n;
}

int64_t be_attn_rows_heads(const be_attn *a, int64_t *hp)
{
    int64_t e = 0, np = pieces(a);
    for (int g = 0; g < a->n_head_kv; g++) {
        int64_t p0, p1;
        list_of(a, g, &p0, &p1);
        hp[g] = e;
        e += p1 - p0 + np;
    }
    hp[a->n_head_kv] = e;
    return e;
}

void be_attn_rows_fill(const be_attn *a, const uint16_t *k16, const uint16_t *v16, const int32_t *pos,
                       be_kv_page *out, const int64_t *hp, const int64_t *from)
{
    int64_t kvd = (int64_t)a->n_head_kv * a->head_dim, np = pieces(a);
    for (int g = 0; g < a->n_head_kv; g++) {
        int64_t p0, p1;
        list_of(a, g, &p0, &p1);
        int64_t skip = from ? from[g] - hp[g] : 0, e = hp[g] + (p1 - p0);
        if (skip < 0) skip = 0;
        if (p1 - p0 > skip) memcpy(out + hp[g] + skip, a->pages + p0 + skip, sizeof(be_kv_page) * (size_t)(p1 - p0 - skip));
        for (int64_t j = 0; j < np; j++) {
            int64_t r0 = j * BE_CUR_ROWS, n = a->n_cur - r0 < BE_CUR_ROWS ? a->n_cur - r0 : BE_CUR_ROWS;
            out[e++] = (be_kv_page){ .k = k16 + r0 * kvd, .v = v16 + r0 * kvd, .pos = pos + r0, .n = (int32_t)n,
                                     .stride = (int32_t)kvd, .head_step = a->head_dim };
        }
    }
}

int64_t be_attn_rows_list(const be_attn *a, const uint16_t *k16, const uint16_t *v16, const int32_t *pos,
                          be_kv_page *out, int64_t *hp)
{
    int64_t e = be_attn_rows_heads(a, hp);
    be_attn_rows_fill(a, k16, v16, pos, out, hp, NULL);
    return e;
}

/* ---------------------------------------------------------------- calls joined into one launch */

int be_attn_seqs_joined(const be_attn *a, int n)
{
    if (n < 2 || n > BE_ATTN_SEQS_MAX) return 0;
    const int64_t HD = (int64_t)a[0].n_head * a[0].head_dim, kvd = (int64_t)a[0].n_head_kv * a[0].head_dim;
    const int cur = a[0].n_cur > 0;
    for (int i = 0; i < n; i++) {
        const be_attn *c = &a[i];
        if (c->n_q != 1 || c->n_head != a[0].n_head || c->n_head_kv != a[0].n_head_kv ||
            c->head_dim != a[0].head_dim || c->window != a[0].window || !c->head_pages)
            return 0;
        if (c->q != a[0].q + i * HD || c->out != a[0].out + i * HD || c->q_pos != a[0].q_pos + i) return 0;
        if ((c->n_cur > 0) != cur) return 0;
        for (int j = 0; j < i; j++)
            if (a[j].table == c->table) return 0;   /* a device keeps one list a name */
        if (cur && (c->n_cur != 1 || c->cur_k != a[0].cur_k + i * kvd || c->cur_v != a[0].cur_v + i * kvd ||
                    c->cur_pos != a[0].cur_pos + i))
            return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------- a selection made by bounds */

int64_t be_attn_sel_len(const be_attn *a)
{
    int64_t n = 0;
    for (int g = 0; g < a->n_head_kv; g++)
        n += a->sel_n_best[g] + (a->head_pages[g + 1] - a->head_pages[g]) - a->sel_from[g];
    return n;
}

int64_t be_attn_sel_list(const be_attn *a, be_kv_page *out, int64_t *hp)
{
    int64_t e = 0;
    for (int g = 0; g < a->n_head_kv; g++) {
        const int64_t h0 = a->head_pages[g], len = a->head_pages[g + 1] - h0, from = a->sel_from[g];
        const int32_t nb = a->sel_n_best[g];
        hp[g] = e;
        const int32_t *best = a->sel_best + (int64_t)g * a->sel_k;
        for (int64_t j = 0; j < nb + len - from; j++) out[e++] = a->pages[h0 + ag_sel_at(best, nb, from, j)];
    }
    hp[a->n_head_kv] = e;
    return e;
}

/* ---------------------------------------------------------------- a choice of tokens made by bounds */

int64_t be_attn_bits_words(const be_attn *a)
{
    int64_t w = 0;
    for (int64_t i = 0; i < a->n_pages; i++) w += ((int64_t)a->pages[i].n + 63) / 64;
    return w;
}

int64_t be_attn_bits_list(const be_attn *a, be_kv_page *out, uint64_t *masks, int64_t *hp)
{
    int64_t e = 0, w = 0;
    for (int g = 0; g < a->n_head_kv; g++) {
        const uint64_t *bm = a->sel_bits + (int64_t)g * a->sel_words;
        hp[g] = e;
        for (int64_t i = a->head_pages[g]; i < a->head_pages[g + 1]; i++) {
            const be_kv_page *p = &a->pages[i];
            const int64_t pw = ((int64_t)p->n + 63) / 64;
            const int32_t on = sg_page_mask(bm, a->sel_words, p->pos, p->n, masks + w, pw);
            if (on == 0) continue;
            out[e] = *p;
            out[e].mask = on == p->n ? NULL : masks + w;
            e++;
            w += on == p->n ? 0 : pw;
        }
    }
    hp[a->n_head_kv] = e;
    return e;
}
