/* merge_heads.c - Chelsea's merge on the host (kernels/backend.h be_merge, defined step by step in
 * kernels/merge_kernels.h): a head after another, each pass's links by the backend's soft_links
 * (the host's threads), ordered by a sort, merged and compacted here. */
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/merge_kernels.h"

static int by_order(const void *x, const void *y)
{
    const be_link *p = x, *q = y;
    return mg_before(p->sim, p->a, q->sim, q->a) ? -1 : mg_before(q->sim, q->a, p->sim, p->a) ? 1 : 0;
}

typedef struct mg_scratch {
    be_link *links;
    char *gone;
    int64_t *partner;
    float *psim;
} mg_scratch;

/* Row src moved to row dst (keys, values, position, degree; the rows may be the same). */
static void move_row(float *k, float *v, int32_t *pos, float *deg, int64_t D, int64_t dst, int64_t src)
{
    memmove(k + dst * D, k + src * D, sizeof(float) * (size_t)D);
    memmove(v + dst * D, v + src * D, sizeof(float) * (size_t)D);
    pos[dst] = pos[src];
    deg[dst] = deg[src];
}

/* Head h's T rows merged to m->target; the new count. */
static int64_t merge_rows(be_backend *b, const be_merge *m, int h, const mg_scratch *s, float *k, float *v,
                          int32_t *pos, float *deg, int64_t T)
{
    const int64_t D = m->dim;
    int pass = 0;
    while (T > m->target) {
        const int64_t m0 = m->sinks, m1 = T - m->recent;
        if (m1 - m0 < 2) break;
        be_links bl = { .k = k, .dim = D, .m0 = m0, .m1 = m1, .chunk = m->chunk, .best = s->partner, .sim = s->psim };
        be_soft_links(b, &bl);
        int64_t nl = 0;
        for (int64_t c0 = m0; c0 < m1; c0 += m->chunk) {
            const int64_t c1 = c0 + m->chunk < m1 ? c0 + m->chunk : m1;
            for (int64_t a = c0; a < c1; a += 2)
                if (s->partner[a - m0] >= 0) s->links[nl++] = (be_link){ a, s->partner[a - m0], s->psim[a - m0] };
        }
        if (nl == 0) break;
        qsort(s->links, (size_t)nl, sizeof *s->links, by_order);
        const int64_t r = T - m->target < nl ? T - m->target : nl;
        memset(s->gone, 0, (size_t)T);
        for (int64_t i = 0; i < r; i++) {   /* in order: a B row taking several A rows takes them so */
            const int64_t a = s->links[i].a, bb = s->links[i].b;
            const float na = deg[a], nb = deg[bb], n = na + nb;
            for (int64_t d = 0; d < D; d++) {
                k[bb * D + d] = mg_centroid(k[bb * D + d], k[a * D + d], nb, na, n);
                v[bb * D + d] = mg_centroid(v[bb * D + d], v[a * D + d], nb, na, n);
            }
            deg[bb] = n;
            s->gone[a] = 1;
        }
        if (m->on_pass) m->on_pass(m->ctx, h, ++pass, s->links, nl, r, s->gone, pos, T);
        int64_t o = 0;
        for (int64_t j = 0; j < T; j++) {
            if (s->gone[j]) continue;
            if (o != j) move_row(k, v, pos, deg, D, o, j);
            o++;
        }
        T = o;
    }
    return T;
}

/* Head h's rows in arrival order, merged back to target each time more than target + gap are held
 * and at the end: arrived rows stay in [0, held), held <= next, so the copies never overlap. */
static int64_t replay_rows(be_backend *b, const be_merge *m, int h, const mg_scratch *s, float *k, float *v,
                           int32_t *pos, float *deg, int64_t T)
{
    int64_t held = 0;
    for (int64_t next = 0; next < T; next++) {
        if (held != next) move_row(k, v, pos, deg, m->dim, held, next);
        held++;
        if (held > m->target + m->gap || (next == T - 1 && held > m->target))
            held = merge_rows(b, m, h, s, k, v, pos, deg, held);
    }
    return held;
}

int be_host_merge_heads(be_backend *b, const be_merge *m)
{
    int64_t most = 1;
    for (int h = 0; h < m->n_heads; h++)
        if (m->heads[h].n > most) most = m->heads[h].n;
    /* one link per A row: more than half the middle when the chunk size is odd (chunk=3: two of
     * every three), so room for every row */
    mg_scratch s = { malloc(sizeof(be_link) * (size_t)most), malloc((size_t)most), malloc(sizeof(int64_t) * (size_t)most),
                     malloc(sizeof(float) * (size_t)most) };
    int rc = s.links && s.gone && s.partner && s.psim ? 0 : -1;
    for (int h = 0; rc == 0 && h < m->n_heads; h++) {
        be_merge_head *mh = &m->heads[h];
        mh->n = m->replay ? replay_rows(b, m, h, &s, mh->k, mh->v, mh->pos, mh->deg, mh->n)
                          : merge_rows(b, m, h, &s, mh->k, mh->v, mh->pos, mh->deg, mh->n);
    }
    free(s.links);
    free(s.gone);
    free(s.partner);
    free(s.psim);
    return rc;
}
