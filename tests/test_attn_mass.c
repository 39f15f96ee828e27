/* The eviction policies' attention mass (be_ops.attn_mass, kernels/backend.h be_mass): the CPU
 * backend's, its rows side by side on its threads, against the plain loop the op is defined by,
 * bit for bit, whatever the threads and the work's room. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/quant.h"
#include "kernels/backend.h"

static uint64_t next(uint64_t *r)
{
    *r = *r * 6364136223846793005ull + 1442695040888963407ull;
    return *r >> 33;
}

static float frand(uint64_t *r) { return (float)(next(r) % 20001) / 10000.0f - 1.0f; }

/* The definition, written as a plain loop. */
static void reference(const be_mass *m, float *acc)
{
    int64_t T = 0;
    for (int64_t i = 0; i < m->n_pages; i++) T += m->pages[i].n;
    float *s = malloc(sizeof(float) * (size_t)(T > 0 ? T : 1));
    cr_assert(s);
    for (int64_t t = 0; t < m->n_q; t++)
        for (int h = 0; h < m->group; h++) {
            const float *q = m->q + t * m->q_stride + (int64_t)(m->first_head + h) * m->head_dim;
            float mx = -INFINITY;
            int64_t j = 0;
            for (int64_t i = 0; i < m->n_pages; i++) {
                const be_kv_page *p = &m->pages[i];
                for (int32_t k = 0; k < p->n; k++, j++) {
                    if (p->pos[k] > m->q_pos0 + t) {
                        s[j] = -INFINITY;
                        continue;
                    }
                    s[j] = be_host_dot_f32_f16(m->head_dim, q, p->k + (size_t)k * (size_t)p->stride);
                    if (p->bias) s[j] += p->bias[k];
                    if (s[j] > mx) mx = s[j];
                }
            }
            if (mx == -INFINITY) continue;
            double l = 0;
            for (j = 0; j < T; j++) {
                s[j] = s[j] == -INFINITY ? 0.0f : expf(s[j] - mx);
                l += s[j];
            }
            float inv = (float)(1.0 / l);
            for (j = 0; j < T; j++) acc[j] += s[j] * inv;
        }
    free(s);
}

Test(attn_mass, the_cpu_gives_the_plain_loops_floats_whatever_the_threads_and_the_room)
{
    char err[256];
    be_backend *b1 = be_cpu_create(1, err, sizeof err), *b3 = be_cpu_create(3, err, sizeof err);
    cr_assert(b1 && b3, "%s", err);
    uint64_t r = 99;
    int cases = 0, empty_rows = 0;
    for (int round = 0; round < 60; round++) {
        int D = 1 + (int)(next(&r) % 160), group = 1 + (int)(next(&r) % 4), n_head_kv = 1 + (int)(next(&r) % 3);
        int g = (int)(next(&r) % n_head_kv), P = 1 + (int)(next(&r) % 40), np = (int)(next(&r) % 30);
        if (round < 4) {   /* long heads: the sums run token range by token range on the threads */
            P = 64;
            np = 100 + (int)(next(&r) % 60);
            D = 1 + (int)(next(&r) % 16);
        }
        int64_t n_q = 1 + (int64_t)(next(&r) % 70), q_stride = (int64_t)n_head_kv * group * D;
        /* pages of f16 keys at ascending, sometimes scattered positions, some with biases (merged) */
        be_kv_page *pages = calloc((size_t)(np > 0 ? np : 1), sizeof *pages);
        uint16_t **ks = calloc((size_t)(np > 0 ? np : 1), sizeof *ks);
        int32_t **ps = calloc((size_t)(np > 0 ? np : 1), sizeof *ps);
        float **bs = calloc((size_t)(np > 0 ? np : 1), sizeof *bs);
        cr_assert(pages && ks && ps && bs);
        int64_t T = 0, pos = 0, first_pos = -1;
        int stride = D + (int)(next(&r) % 3);
        for (int i = 0; i < np; i++) {
            int n = (int)(next(&r) % (P + 1));
            ks[i] = malloc(sizeof(uint16_t) * (size_t)(P * stride + 1));
            ps[i] = malloc(sizeof(int32_t) * (size_t)(P + 1));
            bs[i] = malloc(sizeof(float) * (size_t)(P + 1));
            cr_assert(ks[i] && ps[i] && bs[i]);
            for (int k = 0; k < n * stride; k++) {
                float x = frand(&r) * (float)(1 << (next(&r) % 4));
                be_host_f32_to_f16(1, &x, &ks[i][k]);
            }
            for (int k = 0; k < n; k++) {
                pos += 1 + (next(&r) % 4 == 0 ? (int64_t)(next(&r) % 5) : 0);
                ps[i][k] = (int32_t)pos;
                if (first_pos < 0) first_pos = pos;
                bs[i][k] = logf(1.0f + (float)(next(&r) % 4));
            }
            pages[i] = (be_kv_page){ .k = ks[i], .pos = ps[i], .bias = next(&r) % 3 ? NULL : bs[i], .n = n,
                                     .stride = stride };
            T += n;
        }
        float *q = malloc(sizeof(float) * (size_t)(n_q * q_stride));
        cr_assert(q);
        for (int64_t i = 0; i < n_q * q_stride; i++) q[i] = frand(&r);
        /* some rows before every token (they see nothing), most among them */
        int64_t q_pos0 = (int64_t)(next(&r) % (pos + 8)) - 4;
        if (round % 5 == 0 && first_pos >= 0) q_pos0 = first_pos - 1 - n_q / 2;   /* the first half sees nothing */
        float *want = calloc((size_t)(T > 0 ? T : 1), sizeof(float)), *got = calloc((size_t)(T > 0 ? T : 1), sizeof(float));
        cr_assert(want && got);
        for (int64_t j = 0; j < T; j++) want[j] = got[j] = (float)(next(&r) % 3);   /* the acc adds to what is there */
        be_mass m = { q, n_q, q_stride, q_pos0, g * group, group, D, pages, np, want, NULL, 0 };
        reference(&m, want);
        for (int64_t i = 0; i < n_q; i++) empty_rows += T > 0 && q_pos0 + i < first_pos;
        /* the room for 1 row, a few, and more than 64 */
        const int64_t rooms[3] = { 1, 1 + (int64_t)(next(&r) % 9), 100 };
        for (int ri = 0; ri < 3; ri++)
            for (int bi = 0; bi < 2; bi++) {
                be_backend *b = bi ? b3 : b1;
                float *work = malloc(sizeof(float) * (size_t)((T > 0 ? T : 1) * rooms[ri]));
                cr_assert(work);
                float *acc = malloc(sizeof(float) * (size_t)(T > 0 ? T : 1));
                cr_assert(acc);
                memcpy(acc, got, sizeof(float) * (size_t)T);
                be_mass c = m;
                c.acc = acc;
                c.work = work;
                c.work_len = T * rooms[ri];
                b->ops->attn_mass(b, &c);
                cr_assert(!memcmp(acc, want, sizeof(float) * (size_t)T),
                          "round %d (head dim %d, group %d, %d pages, %lld tokens, %lld rows), room %lld rows, %d "
                          "threads: not the plain loop's floats",
                          round, D, group, np, (long long)T, (long long)n_q, (long long)rooms[ri], bi ? 3 : 1);
                free(work);
                free(acc);
                cases++;
            }
        for (int i = 0; i < np; i++) {
            free(ks[i]);
            free(ps[i]);
            free(bs[i]);
        }
        free(pages);
        free(ks);
        free(ps);
        free(bs);
        free(q);
        free(want);
        free(got);
    }
    cr_assert(cases == 360 && empty_rows > 50, "%d cases, %d rows that see nothing", cases, empty_rows);
    be_free(b1);
    be_free(b3);
}
