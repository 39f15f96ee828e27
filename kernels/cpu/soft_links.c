/* soft_links.c - Chelsea's soft matching on the host (kernels/backend.h be_links): a task a block of
 * SL_A rows of one chunk's set A. Its chunk's B rows are taken SL_B at a time, widened to double and
 * transposed so that vd_pair_dots_f64 runs the block's rows against them in the vector lanes (each
 * sum in element order: the plain loop's doubles), their squared norms summed across the lanes the
 * same way, the cosines by vd_cosines_f64; each A row keeps the first B of the largest cosine as the
 * blocks go by in order, as a plain scan does. Without memory for the blocks, one pair at a time: the same floats. */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/backend.h"
#include "kernels/cpu/threadpool.h"
#include "kernels/cpu/vec_dot.h"
#include "kernels/merge_kernels.h"

enum { SL_A = 64, SL_B = 64 };   /* A rows a task; B rows a block (64 x 256 doubles: 128 KiB, in L2) */

typedef struct sl_job {
    const be_links *l;
    int64_t per_chunk;    /* tasks a chunk */
    double *scratch;      /* a thread's at thread * slot: [SL_B * dim] B block, [SL_A * dim] A rows, [SL_A * SL_B]
                           * dots, [SL_B] + [SL_A] norms */
    size_t slot;
} sl_job;

static void links_task(void *ctx, int64_t task, int thread)
{
    const sl_job *j = ctx;
    const be_links *l = j->l;
    const int64_t D = l->dim, ci = task / j->per_chunk, a0 = task % j->per_chunk * SL_A;
    const int64_t c0 = l->m0 + ci * l->chunk, c1 = c0 + l->chunk < l->m1 ? c0 + l->chunk : l->m1;
    const int64_t n_a = (c1 - c0 + 1) / 2, n_b = (c1 - c0) / 2;
    if (a0 >= n_a) return;
    const int64_t rows = n_a - a0 < SL_A ? n_a - a0 : SL_A;
    const float *xa = l->k + (c0 + 2 * a0) * D;   /* A rows, 2 * D floats apart */
    double *bt = j->scratch + (size_t)thread * j->slot, *xd = bt + SL_B * D, *dots = xd + SL_A * D,
           *nb = dots + SL_A * SL_B, *na = nb + SL_B;
    float best_sim[SL_A], cos[SL_B];
    int64_t best[SL_A];
    for (int64_t r = 0; r < rows; r++) {
        best_sim[r] = -2.0f;
        best[r] = -1;
        na[r] = 0.0;
    }
    for (int64_t r = 0; r < rows; r++)   /* widened, each row's norm in element order */
        for (int64_t i = 0; i < D; i++) xd[r * D + i] = (double)xa[r * 2 * D + i];
    for (int64_t i = 0; i < D; i++)      /* (the rows side by side: no chain of additions to wait on) */
        for (int64_t r = 0; r < rows; r++) na[r] += xd[r * D + i] * xd[r * D + i];
    for (int64_t b0 = 0; b0 < n_b; b0 += SL_B) {
        const int64_t nbk = n_b - b0 < SL_B ? n_b - b0 : SL_B, first = c0 + 1 + 2 * b0;
        vd_widen_transpose(nbk, D, l->k + first * D, 2 * D, bt, nb);   /* with each row's norm */
        vd_pair_dots_f64(D, nbk, bt, rows, xd, D, dots);
        for (int64_t r = 0; r < rows; r++) {
            vd_cosines_f64(nbk, dots + r * nbk, na[r], nb, cos);
            for (int64_t p = 0; p < nbk; p++)
                if (cos[p] > best_sim[r]) {
                    best_sim[r] = cos[p];
                    best[r] = first + 2 * p;
                }
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        const int64_t a = c0 + 2 * (a0 + r) - l->m0;
        l->best[a] = best[r];
        l->sim[a] = best_sim[r];
    }
}

/* The plain formula (merge_kernels.h), a pair at a time (the memory for the blocks was not there). */
static void links_plain(const be_links *l)
{
    const int64_t D = l->dim;
    for (int64_t c0 = l->m0; c0 < l->m1; c0 += l->chunk) {
        const int64_t c1 = c0 + l->chunk < l->m1 ? c0 + l->chunk : l->m1;
        for (int64_t a = c0; a < c1; a += 2) {
            const float *x = l->k + a * D;
            float bs = -2.0f;
            int64_t best = -1;
            for (int64_t b = c0 + 1; b < c1; b += 2) {
                const float *y = l->k + b * D;
                const float s = mg_cosine(x, y, D, mg_norm(x, D), mg_norm(y, D));
                if (s > bs) {
                    bs = s;
                    best = b;
                }
            }
            l->best[a - l->m0] = best;
            l->sim[a - l->m0] = bs;
        }
    }
}

void be_host_soft_links(be_backend *b, const be_links *l)
{
    if (l->dim < 1 || l->chunk < 1 || l->m0 < 0 || l->m1 < l->m0) {
        fprintf(stderr, "kvchat: internal error: soft matching of rows [%lld, %lld) in chunks of %lld, dimension %lld\n",
                (long long)l->m0, (long long)l->m1, (long long)l->chunk, (long long)l->dim);
        abort();
    }
    const int64_t n = l->m1 - l->m0;
    if (n == 0) return;
    be_links c = *l;   /* a chunk longer than the rows is the rows (no sum past them to overflow) */
    if (c.chunk > n) c.chunk = n;
    const int64_t n_chunks = (n + c.chunk - 1) / c.chunk;
    sl_job j = { &c, ((c.chunk + 1) / 2 + SL_A - 1) / SL_A, NULL,
                 (size_t)(SL_B * c.dim + SL_A * c.dim + SL_A * SL_B + SL_B + SL_A) };
    struct tp_pool *pool = b && b->ops->host_pool ? b->ops->host_pool(b) : NULL;
    const int threads = pool ? tp_n_threads(pool) : 1;   /* any thread may take any task */
    j.scratch = malloc(sizeof(double) * j.slot * (size_t)threads);
    if (!j.scratch) {
        links_plain(&c);
        return;
    }
    be_host_run(b, links_task, &j, n_chunks * j.per_chunk);
    free(j.scratch);
}
