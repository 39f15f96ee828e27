/* The eviction policies' attention mass (be_ops.attn_mass, kernels/backend.h be_mass): the CPU
 * backend's, its rows side by side on its threads, against the plain loop the op is defined by,
 * bit for bit, whatever the threads and the work's room; and the CUDA backend's passes
 * (kernels/mass_kernels.h) run on the host for every thread of their launches, against the CPU
 * backend, bit for bit. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/quant.h"
#include "kernels/backend.h"
#include "kernels/exp_poly.h"
#include "kernels/mass_kernels.h"

static uint64_t next(uint64_t *r)
{
    *r = *r * 6364136223846793005ull + 1442695040888963407ull;
    return *r >> 33;
}

static float frand(uint64_t *r) { return (float)(next(r) % 20001) / 10000.0f - 1.0f; }

/* The definition for one KV head, written as a plain loop. */
static void reference_head(const be_mass *m, float *acc)
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
            double part[256] = { 0 };   /* 256 partial sums, then added pairwise */
            for (j = 0; j < T; j++) {
                s[j] = xp_exp(s[j] - mx);
                part[j % 256] += s[j];
            }
            for (int st = 128; st >= 1; st /= 2)
                for (int u = 0; u < st; u++) part[u] += part[u + st];
            float inv = (float)(1.0 / part[0]);
            for (j = 0; j < T; j++) acc[j] += s[j] * inv;
        }
    free(s);
}

/* The definition: KV head after KV head, each the one-head op over its pages, its query heads and
 * its share of acc. */
static void reference(const be_mass *m, float *acc)
{
    if (m->n_kv <= 1) {
        reference_head(m, acc);
        return;
    }
    for (int h = 0; h < m->n_kv; h++) {
        be_mass one = *m;
        one.pages = m->pages + m->head_pages[h];
        one.n_pages = m->head_pages[h + 1] - m->head_pages[h];
        one.first_head = m->first_head + h * m->group;
        one.n_kv = 1;
        reference_head(&one, acc);
        for (int64_t i = 0; i < one.n_pages; i++) acc += one.pages[i].n;
    }
}

/* One call's input: one to three KV heads' pages of f16 keys at ascending, sometimes scattered
 * positions, some with biases (merged), and query rows some of which see nothing. */
typedef struct mass_case {
    be_mass m;
    be_kv_page *pages;
    int64_t hp[4];
    uint16_t **ks;
    int32_t **ps;
    float **bs, *q, *acc0;   /* acc0: what the sums start from */
    int64_t T, first_pos;
} mass_case;

static void make_case(uint64_t *r, int round, int max_d, mass_case *c)
{
    int D = 1 + (int)(next(r) % (uint64_t)max_d), group = 1 + (int)(next(r) % 4), n_head_kv = 1 + (int)(next(r) % 3);
    int nk = 1 + (int)(next(r) % (uint64_t)n_head_kv), g0 = (int)(next(r) % (uint64_t)(n_head_kv - nk + 1));
    int P = 1 + (int)(next(r) % 40), per_head = (int)(next(r) % (nk > 1 ? 14 : 30));
    if (round < 4) {   /* long heads: the sums run token range by token range on the threads */
        P = 64;
        per_head = (100 + (int)(next(r) % 60)) / nk;
        D = 1 + (int)(next(r) % 16);
    }
    int np = per_head * nk;
    int64_t n_q = 1 + (int64_t)(next(r) % 70), q_stride = (int64_t)n_head_kv * group * D;
    c->pages = calloc((size_t)(np > 0 ? np : 1), sizeof *c->pages);
    c->ks = calloc((size_t)(np > 0 ? np : 1), sizeof *c->ks);
    c->ps = calloc((size_t)(np > 0 ? np : 1), sizeof *c->ps);
    c->bs = calloc((size_t)(np > 0 ? np : 1), sizeof *c->bs);
    cr_assert(c->pages && c->ks && c->ps && c->bs);
    int64_t T = 0, last = 0, first_pos = -1;
    int stride = D + (int)(next(r) % 3);
    for (int h = 0; h < nk; h++) {
        c->hp[h] = (int64_t)h * per_head;
        int64_t pos = 0;   /* each head's positions of its own (an evicting policy keeps different ones) */
        for (int i = h * per_head; i < (h + 1) * per_head; i++) {
            int n = (int)(next(r) % (uint64_t)(P + 1));
            c->ks[i] = malloc(sizeof(uint16_t) * (size_t)(P * stride + 1));
            c->ps[i] = malloc(sizeof(int32_t) * (size_t)(P + 1));
            c->bs[i] = malloc(sizeof(float) * (size_t)(P + 1));
            cr_assert(c->ks[i] && c->ps[i] && c->bs[i]);
            for (int k = 0; k < n * stride; k++) {
                float x = frand(r) * (float)(1 << (next(r) % 4));
                be_host_f32_to_f16(1, &x, &c->ks[i][k]);
            }
            for (int k = 0; k < n; k++) {
                pos += 1 + (next(r) % 4 == 0 ? (int64_t)(next(r) % 5) : 0);
                c->ps[i][k] = (int32_t)pos;
                if (first_pos < 0 || pos < first_pos) first_pos = pos;
                c->bs[i][k] = logf(1.0f + (float)(next(r) % 4));
            }
            c->pages[i] = (be_kv_page){ .k = c->ks[i], .pos = c->ps[i], .bias = next(r) % 3 ? NULL : c->bs[i],
                                        .n = n, .stride = stride };
            T += n;
        }
        if (pos > last) last = pos;
    }
    c->hp[nk] = np;
    c->q = malloc(sizeof(float) * (size_t)(n_q * q_stride));
    cr_assert(c->q);
    for (int64_t i = 0; i < n_q * q_stride; i++) c->q[i] = frand(r);
    /* some rows before every token (they see nothing), most among them */
    int64_t q_pos0 = (int64_t)(next(r) % (uint64_t)(last + 8)) - 4;
    if (round % 5 == 0 && first_pos >= 0) q_pos0 = first_pos - 1 - n_q / 2;   /* the first half sees nothing */
    c->acc0 = calloc((size_t)(T > 0 ? T : 1), sizeof(float));
    cr_assert(c->acc0);
    for (int64_t j = 0; j < T; j++) c->acc0[j] = (float)(next(r) % 3);   /* the acc adds to what is there */
    /* one head as the one-head op has it (n_kv 0) or as one of several (n_kv 1) */
    int n_kv = nk > 1 ? nk : (int)(next(r) % 2);
    c->m = (be_mass){ c->q, n_q, q_stride, q_pos0, g0 * group, group, D, c->pages, np, NULL, NULL, 0, 0,
                      n_kv, n_kv > 1 ? c->hp : NULL };
    c->T = T;
    c->first_pos = first_pos;
}

/* The most tokens one head of the case has (the CPU's work is sized by it). */
static int64_t most_tokens(const mass_case *c)
{
    int64_t most = 0;
    int nk = c->m.n_kv > 1 ? c->m.n_kv : 1;
    for (int h = 0; h < nk; h++) {
        int64_t t = 0, a = nk > 1 ? c->hp[h] : 0, b = nk > 1 ? c->hp[h + 1] : c->m.n_pages;
        for (int64_t i = a; i < b; i++) t += c->pages[i].n;
        if (t > most) most = t;
    }
    return most;
}

static void free_case(mass_case *c)
{
    for (int64_t i = 0; i < c->m.n_pages; i++) {
        free(c->ks[i]);
        free(c->ps[i]);
        free(c->bs[i]);
    }
    free(c->pages);
    free(c->ks);
    free(c->ps);
    free(c->bs);
    free(c->q);
    free(c->acc0);
}

Test(attn_mass, the_cpu_gives_the_plain_loops_floats_whatever_the_threads_and_the_room)
{
    char err[256];
    be_backend *b1 = be_cpu_create(1, err, sizeof err), *b3 = be_cpu_create(3, err, sizeof err);
    cr_assert(b1 && b3, "%s", err);
    uint64_t r = 99;
    int cases = 0, empty_rows = 0, several = 0;
    for (int round = 0; round < 60; round++) {
        mass_case c;
        make_case(&r, round, 160, &c);
        const int64_t T = c.T, most = most_tokens(&c);
        several += c.m.n_kv > 1;
        float *want = malloc(sizeof(float) * (size_t)(T > 0 ? T : 1));
        cr_assert(want);
        memcpy(want, c.acc0, sizeof(float) * (size_t)T);
        reference(&c.m, want);
        for (int64_t i = 0; i < c.m.n_q; i++) empty_rows += T > 0 && c.m.q_pos0 + i < c.first_pos;
        /* the room for 1 row, a few, and more than 64 */
        const int64_t rooms[3] = { 1, 1 + (int64_t)(next(&r) % 9), 100 };
        for (int ri = 0; ri < 3; ri++)
            for (int bi = 0; bi < 2; bi++) {
                be_backend *b = bi ? b3 : b1;
                float *work = malloc(sizeof(float) * (size_t)((most > 0 ? most : 1) * rooms[ri]));
                float *acc = malloc(sizeof(float) * (size_t)(T > 0 ? T : 1));
                cr_assert(work && acc);
                memcpy(acc, c.acc0, sizeof(float) * (size_t)T);
                be_mass m = c.m;
                m.acc = acc;
                m.work = work;
                m.work_len = most * rooms[ri];
                b->ops->attn_mass(b, &m);
                cr_assert(!memcmp(acc, want, sizeof(float) * (size_t)T),
                          "round %d (head dim %d, group %d, %d KV heads, %lld pages, %lld tokens, %lld rows), room "
                          "%lld rows, %d threads: not the plain loop's floats",
                          round, m.head_dim, m.group, m.n_kv, (long long)m.n_pages, (long long)T, (long long)m.n_q,
                          (long long)rooms[ri], bi ? 3 : 1);
                free(work);
                free(acc);
                cases++;
            }
        free(want);
        free_case(&c);
    }
    cr_assert(cases == 360 && empty_rows > 50 && several > 10, "%d cases, %d rows that see nothing, %d of several heads",
              cases, empty_rows, several);
    be_free(b1);
    be_free(b3);
}

/* The CUDA backend's three passes as its kernels run them (kernels/cuda/attn_mass.cu
 * mass_score_kernel, mass_weight_kernel, mass_add_kernel), every block and thread on the host,
 * rows in passes of `per`, every KV head of the call in each. A shuffle down past a half-warp's 16
 * lanes gives the lane its own value. */
static void device_passes(const be_mass *m, int64_t T, int64_t per, float *acc)
{
    const int D = m->head_dim, H = m->n_kv > 1 ? m->n_kv : 1;
    const int64_t rows = m->n_q * m->group, np = m->n_pages;
    int64_t hp1[2] = { 0, np }, tok0[4];
    const int64_t *hp = m->n_kv > 1 ? m->head_pages : hp1;
    int64_t *first = malloc(sizeof(int64_t) * (size_t)(np > 0 ? np : 1));
    float *e = malloc(sizeof(float) * (size_t)(per * T)), *factor = malloc(sizeof(float) * (size_t)(per * H));
    float *qs = malloc(sizeof(float) * (size_t)(MS_ROWS * D));
    cr_assert(first && e && factor && qs && H <= 3);
    ms_offsets(m->pages, hp, H, first, tok0);
    for (int64_t x = 0; x < per * T; x++) e[x] = NAN;   /* every score the pass needs is written */
    ms_rows q = { m->q, m->q_stride, m->q_pos0, 0, 0, m->first_head, m->group, D };
    for (q.r0 = 0; q.r0 < rows; q.r0 += per) {
        q.n = rows - q.r0 < per ? rows - q.r0 : per;
        for (int64_t p = 0; p < np; p++)                                    /* blockIdx.x */
            for (int64_t rb = 0; rb < q.n; rb += MS_ROWS) {                 /* blockIdx.y * MS_ROWS */
                const be_kv_page *pg = &m->pages[p];
                const int h = ms_head_of(hp, H, p);
                const int64_t Th = tok0[h + 1] - tok0[h];
                const int nr = q.n - rb < MS_ROWS ? (int)(q.n - rb) : MS_ROWS;
                for (int x = 0; x < MS_ROWS * D; x++) qs[x] = x < nr * D ? ms_query(&q, h, rb + x / D)[x % D] : 0.0f;
                float *head_e = e + q.n * tok0[h] + first[p];
                for (int half = 0; half < MS_THREADS / MS_LANES; half++)
                    for (int32_t i0 = half & ~1; i0 < pg->n; i0 += MS_THREADS / MS_LANES) {
                        const int32_t i = i0 + (half & 1);
                        const uint16_t *k = pg->k + (size_t)(i < pg->n ? i : i0) * (size_t)pg->stride;
                        float v[MS_LANES][MS_ROWS], was[MS_LANES][MS_ROWS];
                        for (int l = 0; l < MS_LANES; l++) ms_lane_parts(qs, k, D, l, v[l]);
                        for (int st = 0; st < MS_TREE_STEPS; st++) {
                            memcpy(was, v, sizeof v);
                            for (int l = 0; l < MS_LANES; l++)
                                for (int rr = 0; rr < MS_ROWS; rr++) {
                                    int from = l + ms_stride(st) < MS_LANES ? l + ms_stride(st) : l;
                                    v[l][rr] = was[l][rr] + was[from][rr];
                                }
                        }
                        if (i >= pg->n) continue;
                        for (int rr = 0; rr < nr; rr++)
                            head_e[(rb + rr) * Th + i] = ms_score(ms_tail(qs + rr * D, k, D, v[0][rr]), pg->bias,
                                                                  pg->pos, i, ms_q_pos(&q, rb + rr));
                    }
            }
        for (int h = 0; h < H; h++)                        /* blockIdx.y */
            for (int64_t row = 0; row < q.n; row++) {      /* blockIdx.x */
                const int64_t Th = tok0[h + 1] - tok0[h];
                float *s = e + q.n * tok0[h] + row * Th, mxs[MS_PARTS];
                double parts[MS_PARTS];
                for (int u = 0; u < MS_PARTS; u++) {
                    mxs[u] = -INFINITY;
                    for (int64_t j = u; j < Th; j += MS_PARTS)
                        if (s[j] > mxs[u]) mxs[u] = s[j];
                }
                for (int st = MS_PARTS / 2; st >= 1; st /= 2)
                    for (int u = 0; u < st; u++)
                        if (mxs[u + st] > mxs[u]) mxs[u] = mxs[u + st];
                const float mx = mxs[0];
                if (mx == -INFINITY) {
                    factor[h * q.n + row] = MS_EMPTY;
                    continue;
                }
                for (int u = 0; u < MS_PARTS; u++) {
                    for (int64_t j = u; j < Th; j += MS_PARTS) s[j] = ms_weight(s[j], mx);
                    parts[u] = ms_part(s, Th, u);
                }
                for (int st = MS_PARTS / 2; st >= 1; st /= 2)
                    for (int u = 0; u < MS_PARTS; u++) ms_parts_step(parts, st, u);
                factor[h * q.n + row] = ms_factor(mx, parts[0]);
            }
        for (int64_t j = 0; j < T; j++) {   /* a thread a key */
            const int h = ms_head_of(tok0, H, j);
            acc[j] = ms_add(acc[j], e + q.n * tok0[h], tok0[h + 1] - tok0[h], q.n, factor + h * q.n, j - tok0[h]);
        }
    }
    free(first);
    free(e);
    free(factor);
    free(qs);
}

Test(attn_mass, the_cuda_passes_run_on_the_host_give_the_cpus_floats)
{
    char err[256];
    be_backend *cpu = be_cpu_create(2, err, sizeof err);
    cr_assert(cpu, "%s", err);
    uint64_t r = 4242;
    int cases = 0, tails[16] = { 0 }, several = 0;
    for (int round = 0; round < 40; round++) {
        mass_case c;
        make_case(&r, round, round % 4 == 1 ? MS_MAX_D : 300, &c);
        const int64_t T = c.T, rows = c.m.n_q * c.m.group;
        if (T == 0) {
            free_case(&c);
            continue;
        }
        float *want = malloc(sizeof(float) * (size_t)T), *got = malloc(sizeof(float) * (size_t)T);
        float *work = malloc(sizeof(float) * (size_t)(T * 8));
        cr_assert(want && got && work);
        memcpy(want, c.acc0, sizeof(float) * (size_t)T);
        be_mass m = c.m;
        m.acc = want;
        m.work = work;
        m.work_len = most_tokens(&c) * 8;
        several += c.m.n_kv > 1;
        cpu->ops->attn_mass(cpu, &m);
        /* every row in one pass, and in passes of a few rows (the device's work is bounded) */
        const int64_t pers[2] = { rows, 1 + (int64_t)(next(&r) % 11) };
        for (int pi = 0; pi < 2; pi++) {
            memcpy(got, c.acc0, sizeof(float) * (size_t)T);
            device_passes(&c.m, T, pers[pi] < rows ? pers[pi] : rows, got);
            int bad = 0;
            for (int64_t j = 0; j < T; j++) bad += memcmp(&got[j], &want[j], sizeof(float)) != 0;
            cr_assert_eq(bad, 0,
                         "round %d (head dim %d, group %d, %d KV heads, %lld pages, %lld tokens, %lld rows), passes "
                         "of %lld rows: %d of %lld sums differ from the CPU's",
                         round, c.m.head_dim, c.m.group, c.m.n_kv, (long long)c.m.n_pages, (long long)T,
                         (long long)c.m.n_q, (long long)pers[pi], bad, (long long)T);
            cases++;
        }
        tails[c.m.head_dim % 16]++;
        free(want);
        free(got);
        free(work);
        free_case(&c);
    }
    int kinds = 0;
    for (int i = 0; i < 16; i++) kinds += tails[i] > 0;
    cr_assert(cases >= 70 && kinds >= 10 && several >= 8, "%d cases, %d of the 16 head dimensions' remainders, %d of "
              "several heads", cases, kinds, several);
    be_free(cpu);
}
