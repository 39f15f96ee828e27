/* lsh_hits.c - LASER-KV's SimHash recall on the host (kernels/backend.h be_lsh): the query rows'
 * codes a KV head a task, then the keys' codes and hits a run of pages a task, every dot by
 * vd_plane_dots (the planes in the vector lanes), the codes by kernels/lsh_kernels.h. A key's
 * count a round is looked up in a table of the query codes' counts where the codes are short
 * (LSH_TABLE_BITS; a binary search took more time than the dots), else by lsh_count's binary
 * searches: the same integers. */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/backend.h"
#include "kernels/cpu/vec_dot.h"
#include "kernels/lsh_kernels.h"

enum { LSH_TASKS = 64 };   /* runs of pages the keys are split into (the threads take them in turn) */

static void check_shape(const be_lsh *l)
{
    if (l->rounds < 1 || l->rounds > LSH_MAX_ROUNDS || l->bits < 1 || l->bits > LSH_MAX_BITS || l->head_dim < 1 ||
        l->head_dim > LSH_MAX_D || l->group < 1) {
        fprintf(stderr, "kvchat: internal error: SimHash recall of %d rounds of %d bits, head dimension %d, group %d\n",
                l->rounds, l->bits, l->head_dim, l->group);
        abort();
    }
}

static uint32_t code_of(const float *dots, int r, int bits)
{
    uint32_t c = 0;
    for (int b = 0; b < bits; b++) c |= lsh_bit(dots[r * bits + b], b);
    return c;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

typedef struct lsh_job {
    const be_lsh *l;
    int32_t *table;   /* [n_kv][rounds][2^bits] the query codes' counts, or NULL: binary searches */
    int64_t tasks;    /* runs of pages */
} lsh_job;

/* KV head h's query codes, each round's sorted (and counted into the table). */
static void query_task(void *ctx, int64_t h, int thread)
{
    (void)thread;
    const lsh_job *j = ctx;
    const be_lsh *l = j->l;
    const int P = l->rounds * l->bits, D = l->head_dim, G = l->group;
    const int64_t nq = l->n_q * G;
    float dots[LSH_MAX_PLANES];
    for (int64_t t = 0; t < l->n_q; t++)
        for (int hh = 0; hh < G; hh++) {
            const float *x = l->q + t * l->q_stride + (int64_t)(l->first_head + (int)h * G + hh) * D;
            vd_plane_dots(D, P, l->planes_t, x, dots);
            for (int r = 0; r < l->rounds; r++) l->codes[(h * l->rounds + r) * nq + t * G + hh] = code_of(dots, r, l->bits);
        }
    for (int r = 0; r < l->rounds; r++) {
        uint32_t *c = l->codes + (h * l->rounds + r) * nq;
        qsort(c, (size_t)nq, sizeof(uint32_t), cmp_u32);
        if (!j->table) continue;
        int32_t *tb = j->table + ((h * l->rounds + r) << l->bits);
        for (int64_t i = 0; i < nq; i++) tb[c[i]]++;
    }
}

static void query_codes(be_backend *b, const lsh_job *j)
{
    check_shape(j->l);
    be_host_run(b, query_task, (void *)j, j->l->n_kv > 1 ? j->l->n_kv : 1);
}

void be_host_lsh_query_codes(be_backend *b, const be_lsh *l)
{
    lsh_job j = { l, NULL, 0 };
    query_codes(b, &j);
}

/* The hits of the tokens of pages [task * n / tasks, (task + 1) * n / tasks). */
static void key_task(void *ctx, int64_t task, int thread)
{
    (void)thread;
    const lsh_job *kj = ctx;
    const be_lsh *l = kj->l;
    const int P = l->rounds * l->bits, D = l->head_dim, H = l->n_kv > 1 ? l->n_kv : 1;
    const int64_t nq = l->n_q * l->group, a = task * l->n_pages / kj->tasks, e = (task + 1) * l->n_pages / kj->tasks;
    int64_t j = 0;
    for (int64_t i = 0; i < a; i++) j += l->pages[i].n;
    int h = 0;
    float x[LSH_MAX_D], dots[LSH_MAX_PLANES];
    for (int64_t i = a; i < e; i++) {
        while (H > 1 && h < H - 1 && l->head_pages[h + 1] <= i) h++;
        const be_kv_page *pg = &l->pages[i];
        const uint32_t *codes = l->codes + (int64_t)h * l->rounds * nq;
        const int32_t *table = kj->table ? kj->table + (((int64_t)h * l->rounds) << l->bits) : NULL;
        for (int32_t t = 0; t < pg->n; t++, j++) {
            if (pg->pos[t] < l->pos_min) {
                l->hits[j] = 0;
                continue;
            }
            vd_f16_to_f32(D, pg->k + (size_t)t * (size_t)pg->stride, x);
            vd_plane_dots(D, P, l->planes_t, x, dots);
            int32_t hits = 0;
            for (int r = 0; r < l->rounds; r++) {
                const uint32_t c = code_of(dots, r, l->bits);
                hits += table ? table[((int64_t)r << l->bits) + c] : lsh_count(codes + r * nq, nq, c);
            }
            l->hits[j] = hits;
        }
    }
}

void be_host_lsh_hits(be_backend *b, const be_lsh *l)
{
    const int H = l->n_kv > 1 ? l->n_kv : 1;
    lsh_job j = { l, NULL, l->n_pages < LSH_TASKS ? l->n_pages : LSH_TASKS };
    /* a table where the codes are short (n_kv x rounds x 2^bits counts: 2 MiB at 8 KV heads and 64
     * rounds); without the memory, the searches */
    if (l->bits <= LSH_TABLE_BITS) j.table = calloc((size_t)H * (size_t)l->rounds << l->bits, sizeof(int32_t));
    query_codes(b, &j);
    if (j.tasks > 0) be_host_run(b, key_task, &j, j.tasks);
    free(j.table);
}
