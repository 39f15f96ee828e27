/* The selection policies' bounds (be_ops.bound_pages): the CPU backend's against plain sums and a
 * sort of every key, the CUDA kernel's threads run on the host against the CPU bit for bit (and
 * the CUDA scores kernel's, CHESS's be_ops.scores, likewise), and
 * the summaries a device keeps per named list (kernels/summary_lists.c) with host memory standing
 * in for the device (junk in fresh allocations). */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/logit_pick.h"
#include "kernels/backend.h"
#include "kernels/bound_kernels.h"
#include "kernels/segment_kernels.h"
#include "kernels/score_kernels.h"
#include "kernels/cpu/vec_dot.h"
#include "kernels/summary_lists.h"
#include "kernels/upload_batch.h"
#include "tests/test_rng.h"

static void seed_rng(const char *what) { test_rng_seed(what, "BOUNDS_SEED", (uint64_t)time(NULL) * 2654435761u); }

/* Summaries for H heads of counts cnt[h]: [total][2][dim] floats, mn <= mx, some repeated (equal
 * bounds), some coarse (ties between different summaries), a few with -0. */
typedef struct rig {
    int H, G;
    int64_t dim, off[9];
    float *mm, *q;
    be_summary *sum;
} rig;

static void rig_make(rig *r, int H, int G, int64_t dim, const int64_t *cnt)
{
    r->H = H, r->G = G, r->dim = dim;
    r->off[0] = 0;
    for (int h = 0; h < H; h++) r->off[h + 1] = r->off[h] + cnt[h];
    int64_t n = r->off[H];
    r->mm = malloc(sizeof(float) * (size_t)((n > 0 ? n : 1) * 2 * dim));
    r->sum = malloc(sizeof *r->sum * (size_t)(n > 0 ? n : 1));
    r->q = malloc(sizeof(float) * (size_t)(H * G * dim));
    cr_assert(r->mm && r->sum && r->q);
    for (int64_t i = 0; i < n; i++) {
        float *mn = r->mm + i * 2 * dim, *mx = mn + dim;
        int coarse = rnd() % 4 == 0;
        for (int64_t d = 0; d < dim; d++) {
            float a = frand(-2, 2), c = frand(-2, 2);
            if (coarse) a = (float)(int)(a * 2) / 2, c = (float)(int)(c * 2) / 2;
            mn[d] = a < c ? a : c;
            mx[d] = a < c ? c : a;
            if (rnd() % 64 == 0) mn[d] = -0.0f;
        }
        r->sum[i] = (be_summary){ .mn = mn, .mx = mx, .gen = (uint64_t)i + 1, .n = 1 };
        if (i > 0 && rnd() % 8 == 0) r->sum[i] = r->sum[i - 1 - rnd() % (uint32_t)(i < 5 ? i : 5)];
    }
    for (int64_t i = 0; i < H * G * dim; i++) r->q[i] = rnd() % 16 == 0 ? 0.0f : frand(-1, 1);
}

static void rig_free(rig *r)
{
    free(r->mm);
    free(r->sum);
    free(r->q);
}

/* The bound of summary i of head h, as one loop adds it. */
static float plain_bound(const rig *r, int h, int64_t i)
{
    float u = 0;
    for (int j = 0; j < r->G; j++)
        u += vd_bound_f32(r->dim, r->q + ((int64_t)h * r->G + j) * r->dim, r->sum[i].mn, r->sum[i].mx);
    return u;
}

static int by_key_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x < y) - (x > y);
}
static int by_int(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Head h's k best of u by sorting every key: ascending ids into ids, their count returned. */
static int ref_best(const float *u, int64_t n, int k, int32_t *ids)
{
    uint64_t *keys = malloc(sizeof *keys * (size_t)(n > 0 ? n : 1));
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        float v = lp_value(u[i]);
        if (v > -INFINITY) keys[m++] = lp_key(v, (int32_t)i);
    }
    qsort(keys, (size_t)m, sizeof *keys, by_key_desc);
    int c = (int)(m < k ? m : k);
    for (int i = 0; i < c; i++) ids[i] = lp_key_id(keys[i]);
    qsort(ids, (size_t)c, sizeof *ids, by_int);
    free(keys);
    return c;
}

Test(bounds, the_cpu_bounds_are_the_plain_sums_and_the_best_a_sort_of_every_key)
{
    seed_rng("the_cpu_bounds_are_the_plain_sums_and_the_best_a_sort_of_every_key");
    char err[256];
    be_backend *b1 = be_cpu_create(1, err, sizeof err), *b3 = be_cpu_create(3, err, sizeof err);
    cr_assert(b1 && b3, "%s", err);
    static const int64_t dims[] = { 1, 7, 16, 64, 80, 128, 130 };
    static const int ks[] = { 1, 2, 3, 17, 64, 256, 300 };
    for (int round = 0; round < 60; round++) {
        int H = 1 + (int)(rnd() % 8), G = 1 + (int)(rnd() % 4);
        int64_t cnt[8], dim = dims[rnd() % 7];
        for (int h = 0; h < H; h++) cnt[h] = rnd() % 5 == 0 ? (int64_t)(rnd() % 3) : (int64_t)(rnd() % 1500);
        rig r;
        rig_make(&r, H, G, dim, cnt);
        int64_t n = r.off[H];
        /* some bounds are NaN or infinite: a summary holding them */
        if (n > 4 && round % 3 == 0) {
            float *mn = r.mm + (int64_t)(rnd() % (uint32_t)n) * 2 * dim;
            mn[0] = NAN;
            float *mx = r.mm + (int64_t)(rnd() % (uint32_t)n) * 2 * dim + dim;
            mx[dim - 1] = INFINITY;
        }
        float *u1 = malloc(sizeof(float) * (size_t)(n + 1)), *u3 = malloc(sizeof(float) * (size_t)(n + 1));
        int32_t best[8 * BE_PICK_MAX], nb[8], best3[8 * BE_PICK_MAX], nb3[8], want[BE_PICK_MAX];
        int k = ks[rnd() % 7];
        be_bounds q1 = { .q = r.q, .n_head_kv = H, .group = G, .dim = dim, .sum = r.sum, .off = r.off, .k = k,
                         .best = best, .n_best = nb, .u = u1 };
        be_bounds q3 = q1;
        q3.best = best3, q3.n_best = nb3, q3.u = u3;
        b1->ops->bound_pages(b1, &q1);
        b3->ops->bound_pages(b3, &q3);
        cr_assert_eq(q1.k, k < BE_PICK_MAX ? k : BE_PICK_MAX, "k clamped to BE_PICK_MAX and reported");
        int bad = 0;
        for (int h = 0; h < H; h++)
            for (int64_t i = r.off[h]; i < r.off[h + 1]; i++) {
                float w = plain_bound(&r, h, i);
                bad += memcmp(&w, &u1[i], sizeof w) != 0 || memcmp(&w, &u3[i], sizeof w) != 0;
            }
        cr_expect_eq(bad, 0, "round %d: %d of %lld bounds differ from the plain sums (dim %lld, group %d)", round, bad,
                     (long long)n, (long long)dim, G);
        for (int h = 0; h < H; h++) {
            int c = ref_best(u1 + r.off[h], cnt[h], q1.k, want);
            cr_expect_eq(nb[h], c, "round %d head %d: %d best, want %d", round, h, nb[h], c);
            cr_expect_eq(nb3[h], c, "round %d head %d: on 3 threads", round, h);
            cr_expect(!memcmp(best + h * q1.k, want, sizeof(int32_t) * (size_t)c), "round %d head %d: the best differ",
                      round, h);
            cr_expect(!memcmp(best3 + h * q1.k, want, sizeof(int32_t) * (size_t)c), "round %d head %d (3 threads)",
                      round, h);
        }
        /* without the bounds asked for, the same best */
        q1.u = NULL;
        int32_t again[8 * BE_PICK_MAX], nb_again[8];
        q1.best = again, q1.n_best = nb_again;
        b3->ops->bound_pages(b3, &q1);
        for (int h = 0; h < H; h++)
            cr_expect(nb_again[h] == nb[h] && !memcmp(again + h * q1.k, best + h * q1.k, sizeof(int32_t) * (size_t)nb[h]),
                      "round %d head %d: the best without the bounds", round, h);
        free(u1);
        free(u3);
        rig_free(&r);
    }
    be_free(b1);
    be_free(b3);
}

/* The device keeps a list's summaries as [head][cap][mn | mx]; lay them out so, with junk past
 * each head's count, as a list the device has been sent. */
static float *device_layout(const rig *r, int64_t cap)
{
    float *dev = malloc(sizeof(float) * (size_t)(r->H * cap * 2 * r->dim));
    cr_assert(dev);
    for (int64_t i = 0; i < r->H * cap * 2 * r->dim; i++) dev[i] = NAN;
    for (int h = 0; h < r->H; h++)
        for (int64_t i = 0; i < r->off[h + 1] - r->off[h]; i++) {
            const be_summary *s = &r->sum[r->off[h] + i];
            float *d = dev + ((int64_t)h * cap + i) * 2 * r->dim;
            memcpy(d, s->mn, sizeof(float) * (size_t)r->dim);
            memcpy(d + r->dim, s->mx, sizeof(float) * (size_t)r->dim);
        }
    return dev;
}

/* bound_kernel's arithmetic for every (block, thread) of its launch, its shuffles as the tree
 * steps over the sixteen lanes' values. */
static void run_bound_kernel(const rig *r, const float *dev, int64_t cap, int64_t stride, float *u)
{
    int64_t blocks = (stride + BD_PER_BLOCK - 1) / BD_PER_BLOCK;
    for (int h = 0; h < r->H; h++)
        for (int64_t bx = 0; bx < blocks; bx++)
            for (int g0 = 0; g0 < BD_THREADS; g0 += BD_LANES) {
                int64_t i = bd_entry(bx, g0), n = r->off[h + 1] - r->off[h];
                for (int t = 1; t < BD_LANES; t++) cr_assert_eq(bd_entry(bx, g0 + t), i, "a lane group is one summary");
                const float *mn = dev + bd_summary_at(h, cap, i, r->dim), *mx = mn + r->dim;
                float acc = 0.0f;
                for (int j = 0; j < r->G; j++) {
                    const float *qj = r->q + bd_query_at(h, r->G, j, r->dim);
                    float v[BD_LANES];
                    for (int lane = 0; lane < BD_LANES; lane++)
                        v[lane] = i < n ? bd_lane_sum(qj, mn, mx, r->dim, lane) : 0.0f;
                    for (int st = BD_LANES / 2; st > 0; st >>= 1)
                        for (int lane = 0; lane < st; lane++) bd_tree_step(v, st, lane);
                    if (i < n) acc += bd_tail(qj, mn, mx, r->dim, v[0]);
                }
                if (i < stride) u[bd_out_at(h, stride, i)] = i < n ? acc : -INFINITY;
            }
}

/* Room between the heads (be_bounds.end, as SentKV's lists leave for their next segments): the same
 * bounds, best and segment choice as the heads side by side, and nothing in the room read (its
 * entries lead nowhere: reading one crashes). */
Test(bounds, heads_with_room_between_them_bound_and_choose_as_side_by_side)
{
    seed_rng("heads_with_room_between_them_bound_and_choose_as_side_by_side");
    char err[256];
    be_backend *b = be_cpu_create(3, err, sizeof err);
    cr_assert(b, "%s", err);
    for (int round = 0; round < 40; round++) {
        int H = 1 + (int)(rnd() % 8), G = 1 + (int)(rnd() % 4);
        int64_t cnt[8], dim = 1 + (int64_t)(rnd() % 130);
        for (int h = 0; h < H; h++) cnt[h] = rnd() % 5 == 0 ? (int64_t)(rnd() % 3) : (int64_t)(rnd() % 700);
        rig r;
        rig_make(&r, H, G, dim, cnt);
        int64_t off[9], end[8], len = 0;
        off[0] = 0;
        for (int h = 0; h < H; h++) {
            end[h] = off[h] + cnt[h];
            off[h + 1] = end[h] + (int64_t)(rnd() % 50);
            len = cnt[h] > len ? cnt[h] : len;
        }
        be_summary *gap = malloc(sizeof *gap * (size_t)(off[H] + 1));
        cr_assert(gap);
        for (int64_t i = 0; i < off[H]; i++) gap[i] = (be_summary){ .n = 1 };   /* mn, mx NULL */
        for (int h = 0; h < H; h++)
            for (int64_t i = 0; i < cnt[h]; i++) gap[off[h] + i] = r.sum[r.off[h] + i];
        int64_t words = (len + 63) / 64 + 1;
        float *u1 = malloc(sizeof(float) * (size_t)(r.off[H] + 1)), *u2 = malloc(sizeof(float) * (size_t)(off[H] + 1));
        uint64_t *bits1 = calloc((size_t)(H * words), sizeof(uint64_t)), *bits2 = calloc((size_t)(H * words), sizeof(uint64_t));
        cr_assert(u1 && u2 && bits1 && bits2);
        int32_t best1[8 * 64], nb1[8], best2[8 * 64], nb2[8];
        int segs = round % 2;
        be_bounds q1 = { .q = r.q, .n_head_kv = H, .group = G, .dim = dim, .sum = r.sum, .off = r.off, .u = u1 };
        if (segs) {   /* every summary a segment of one position */
            q1.bits = bits1, q1.words = words, q1.len = len, q1.budget = 1 + (int64_t)(rnd() % (uint32_t)(len + 1));
            q1.sinks = (int64_t)(rnd() % 3);
        } else {
            q1.k = 1 + (int)(rnd() % 64), q1.best = best1, q1.n_best = nb1;
        }
        be_bounds q2 = q1;
        q2.sum = gap, q2.off = off, q2.end = end, q2.u = u2, q2.bits = segs ? bits2 : NULL, q2.best = best2;
        q2.n_best = nb2;
        b->ops->bound_pages(b, &q1);
        b->ops->bound_pages(b, &q2);
        for (int h = 0; h < H; h++) {
            cr_assert_eq(be_bounds_count(&q2, h), cnt[h]);
            cr_expect(!memcmp(u1 + r.off[h], u2 + off[h], sizeof(float) * (size_t)cnt[h]), "round %d head %d: the bounds",
                      round, h);
            if (segs) {
                cr_expect(!memcmp(bits1 + h * words, bits2 + h * words, sizeof(uint64_t) * (size_t)words),
                          "round %d head %d: the segments chosen", round, h);
            } else {
                cr_expect(nb1[h] == nb2[h] && !memcmp(best1 + h * q1.k, best2 + h * q1.k, sizeof(int32_t) * (size_t)nb1[h]),
                          "round %d head %d: the best", round, h);
            }
        }
        free(gap);
        free(u1);
        free(u2);
        free(bits1);
        free(bits2);
        rig_free(&r);
    }
    be_free(b);
}

Test(bounds, the_bound_kernels_threads_on_the_host_give_the_cpus_bounds_bit_for_bit)
{
    seed_rng("the_bound_kernels_threads_on_the_host_give_the_cpus_bounds_bit_for_bit");
    char err[256];
    be_backend *b = be_cpu_create(2, err, sizeof err);
    cr_assert(b, "%s", err);
    static const int64_t dims[] = { 1, 15, 16, 17, 64, 80, 128, 200, 256 };
    for (int round = 0; round < 40; round++) {
        int H = 1 + (int)(rnd() % 8), G = 1 + (int)(rnd() % 8);
        int64_t cnt[8], dim = dims[round % 9], most = 1;
        for (int h = 0; h < H; h++) {
            cnt[h] = (int64_t)(rnd() % 300);
            if (cnt[h] > most) most = cnt[h];
        }
        rig r;
        rig_make(&r, H, G, dim, cnt);
        int64_t cap = most + (int64_t)(rnd() % 40);
        float *dev = device_layout(&r, cap);
        float *u = malloc(sizeof(float) * (size_t)(H * most)), *want = malloc(sizeof(float) * (size_t)(r.off[H] + 1));
        be_bounds q = { .q = r.q, .n_head_kv = H, .group = G, .dim = dim, .sum = r.sum, .off = r.off, .u = want };
        b->ops->bound_pages(b, &q);
        run_bound_kernel(&r, dev, cap, most, u);
        int bad = 0, pad = 0;
        for (int h = 0; h < H; h++)
            for (int64_t i = 0; i < most; i++) {
                float got = u[(int64_t)h * most + i];
                if (i < cnt[h])
                    bad += memcmp(&got, &want[r.off[h] + i], sizeof got) != 0;
                else
                    pad += !(isinf(got) && got < 0);
            }
        cr_expect_eq(bad, 0, "round %d: %d bounds differ from the CPU's (dim %lld, group %d)", round, bad,
                     (long long)dim, G);
        cr_expect_eq(pad, 0, "round %d: %d padding entries are not -inf", round, pad);
        /* each head's row padded with -inf to the longest gives the pick the same best */
        for (int h = 0; h < H; h++) {
            int32_t id_a[BE_PICK_MAX], id_b[BE_PICK_MAX];
            float val[BE_PICK_MAX];
            be_pick pa = { .logits = u + (int64_t)h * most, .n = (int32_t)cnt[h], .k = 40, .val = val, .id = id_a };
            be_pick pb = pa;
            pb.n = (int32_t)most, pb.id = id_b;
            if (cnt[h] > 0) b->ops->pick(b, &pa, 1);
            b->ops->pick(b, &pb, 1);
            cr_expect(pa.n_out == pb.n_out && !memcmp(id_a, id_b, sizeof(int32_t) * (size_t)pa.n_out),
                      "round %d head %d: the padded row's best differ", round, h);
        }
        free(dev);
        free(u);
        free(want);
        rig_free(&r);
    }
    be_free(b);
}

/* ---------------------------------------------------------------- the device's lists */

static int64_t live;
static int alloc_fails;

static void *h_alloc(void *ud, size_t bytes)
{
    (void)ud;
    if (alloc_fails) return NULL;
    float *p = malloc(bytes);
    if (!p) return NULL;
    for (size_t i = 0; i < bytes / sizeof(float); i++) p[i] = NAN;
    live++;
    return p;
}

static void h_release(void *ud, void *p)
{
    (void)ud;
    live--;
    free(p);
}

/* What the device does with a batch: one copy of the packed bytes, then the scatter kernel. */
static uint64_t send(ub_batch *ub)
{
    size_t bytes = ub_packed_bytes(ub);
    unsigned char *buf = aligned_alloc(16, (bytes + 15) & ~(size_t)15);
    cr_assert(buf || bytes == 0);
    ub_pack(ub, buf);
    const ub_piece *tab = (const ub_piece *)(buf + ub_table_offset(ub));
    for (int64_t i = 0; i < ub->n; i++)
        for (int tid = 0; tid < 4; tid++) ub_scatter_piece(buf, &tab[i], tid, 4);
    uint64_t n = (uint64_t)ub->n;
    ub_clear(ub, 1);
    free(buf);
    return n;
}

/* Every entry the device holds for the list is the summary the call named, and its n. */
static int check_list(const sl_list *L, const be_bounds *r)
{
    int bad = 0;
    for (int h = 0; h < r->n_head_kv; h++)
        for (int64_t i = 0; i < r->off[h + 1] - r->off[h]; i++) {
            const be_summary *s = &r->sum[r->off[h] + i];
            const float *d = L->dev + ((int64_t)h * L->cap + i) * 2 * r->dim;
            bad += memcmp(d, s->mn, sizeof(float) * (size_t)r->dim) != 0 ||
                   memcmp(d + r->dim, s->mx, sizeof(float) * (size_t)r->dim) != 0 ||
                   L->dev_n[(int64_t)h * L->cap + i] != s->n;   /* SentKV's segment lengths */
        }
    return bad;
}

/* Heads' summaries side by side for a bounds call: head h's cnt[h] from sum + h * maxn. */
static void flatten(const be_summary *sum, int64_t maxn, const int64_t *cnt, int H, be_summary *flat, int64_t *off)
{
    off[0] = 0;
    for (int h = 0; h < H; h++) {
        memcpy(flat + off[h], sum + h * maxn, sizeof *flat * (size_t)cnt[h]);
        off[h + 1] = off[h] + cnt[h];
    }
}

/* A cache-like history under two names: heads gain summaries at their ends (the last one's
 * contents changing with a new n), a shape break rewrites entries in the middle, drops some and
 * reuses memory, the batch is sometimes lost, the device sometimes out of memory. After every call
 * the batch is sent and every entry checked. */
Test(bounds, the_device_lists_hold_every_summary_named_through_a_random_history)
{
    seed_rng("the_device_lists_hold_every_summary_named_through_a_random_history");
    enum { H = 3, D = 20, MAXN = 400, NAMES = 2 };
    ub_batch ub = { 0 };
    sl_table t;
    sl_device dev = { NULL, h_alloc, h_release, NULL };
    sl_init(&t, &dev, &ub);
    static float pool[NAMES][H][MAXN][2][D];
    static float apart[NAMES][H][MAXN][D];   /* a third of the maxima apart from their minima */
#define MX_OF(nm, h, i) ((i) % 3 == 0 ? apart[nm][h][i] : pool[nm][h][i][1])
    static be_summary sum[NAMES][H * MAXN];
    int64_t cnt[NAMES][H] = { { 0 } };
    uint64_t shape[NAMES] = { 11, 21 }, gen = 100;
    uint64_t last_shape[NAMES] = { 0 };   /* of the last call under the name that the device got */
    int64_t last_cap[NAMES] = { 0 };
    int64_t next_shape = 1000;
    for (int step = 0; step < 3000; step++) {
        int nm = (int)(rnd() % NAMES);
        int event = (int)(rnd() % 20);
        for (int h = 0; h < H; h++) {
            if (event < 15) {   /* a decode step: the last entry grows, now and then a new one */
                if (cnt[nm][h] > 0 && rnd() % 2) {
                    float *mx = MX_OF(nm, h, cnt[nm][h] - 1);
                    mx[rnd() % D] += 1.0f;
                    sum[nm][h * MAXN + cnt[nm][h] - 1].n++;
                }
                if (cnt[nm][h] < MAXN && (cnt[nm][h] == 0 || rnd() % 3 == 0)) {
                    int64_t i = cnt[nm][h]++;
                    for (int d = 0; d < D; d++) pool[nm][h][i][0][d] = frand(-1, 0), MX_OF(nm, h, i)[d] = frand(0, 1);
                    sum[nm][h * MAXN + i] = (be_summary){ .mn = pool[nm][h][i][0], .mx = MX_OF(nm, h, i), .gen = ++gen, .n = 1 };
                }
            } else {   /* a shape break: entries rewritten in place (new gens), some dropped */
                for (int64_t i = 0; i < cnt[nm][h]; i++)
                    if (rnd() % 4 == 0) {
                        pool[nm][h][i][0][rnd() % D] -= 1.0f;
                        sum[nm][h * MAXN + i].gen = ++gen;
                    }
                if (rnd() % 2) cnt[nm][h] = (int64_t)(rnd() % (uint32_t)(cnt[nm][h] + 1));
                shape[nm] = (uint64_t)next_shape++;
            }
        }
        /* the call's list: each head's entries side by side */
        static be_summary flat[H * MAXN];
        int64_t off[H + 1];
        flatten(sum[nm], MAXN, cnt[nm], H, flat, off);
        be_bounds r = { .n_head_kv = H, .group = 1, .dim = D, .sum = flat, .off = off, .table = (uint64_t)nm + 7,
                        .shape = rnd() % 10 ? shape[nm] : 0 };
        alloc_fails = rnd() % 200 == 0;
        char err[128];
        uint64_t looked0 = t.looked;
        const sl_list *L = sl_update(&t, &r, err, sizeof err);
        alloc_fails = 0;
        if (!L || rnd() % 50 == 0) {   /* out of memory, or the batch lost on the way: the caller drops it */
            ub_clear(&ub, 0);
            sl_forget(&t);
            memset(last_shape, 0, sizeof last_shape);
            continue;
        }
        send(&ub);
        cr_assert_eq(check_list(L, &r), 0, "step %d: the device's entries differ from the summaries named", step);
        if (r.shape && r.shape == last_shape[nm] && L->cap == last_cap[nm])
            cr_assert_leq(t.looked - looked0, 2 * H, "step %d: a kept shape looked at %llu entries", step,
                          (unsigned long long)(t.looked - looked0));
        last_shape[nm] = r.shape;
        last_cap[nm] = L->cap;
    }
    sl_free(&t);
    ub_free(&ub);
    cr_expect_eq(live, 0, "every device allocation released");
#undef MX_OF
}

/* A random half: mostly ordinary values, and zeros of both signs, infinities, NaNs and subnormals. */
static uint16_t odd_half(void)
{
    static const uint16_t special[] = { 0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0xfe01, 0x0001, 0x83ff, 0x7bff, 0xfbff };
    uint32_t c = rnd() % 16;
    if (c < 3) return special[rnd() % (sizeof special / sizeof *special)];
    if (c < 5) return (uint16_t)(rnd() & 0xffff);   /* any bits: NaN payloads, subnormals */
    return (uint16_t)((rnd() % 2 ? 0x8000 : 0) | (0x3800 + rnd() % 0x800));   /* 0.5 to 1, either sign */
}

/* A fold's threads (bd_fold_elem, every element of a block) give the cache's fold of the same rows
 * bit for bit (be_host_key_summary_rows: the vector kernel the cache runs, from FLT_MAX and
 * -FLT_MAX), NaNs and the signs of zeros included, for every count of rows up to a page's. */
Test(bounds, a_folds_threads_give_the_caches_summary_bit_for_bit)
{
    seed_rng("a_folds_threads_give_the_caches_summary_bit_for_bit");
    static const int64_t dims[] = { 64, 128, 256, 80, 200 };
    for (int round = 0; round < 40; round++) {
        int64_t D = dims[round % 5];
        int32_t n = 1 + (int32_t)(rnd() % 48);
        uint16_t *k = malloc(sizeof *k * (size_t)(n * D));
        float *ref = malloc(sizeof(float) * (size_t)(3 * D)), *dev = malloc(sizeof(float) * (size_t)(3 * 2 * D));
        cr_assert(k && ref && dev);
        for (int64_t i = 0; i < n * D; i++) k[i] = odd_half();
        if (round % 4 == 0)   /* equal values of either sign in one element: the first must stay */
            for (int32_t r = 0; r < n; r++) k[(int64_t)r * D] = rnd() % 2 ? 0x8000 : 0x0000;
        float *sum = ref, *mn = ref + D, *mx = ref + 2 * D;
        for (int64_t d = 0; d < D; d++) sum[d] = 0, mn[d] = FLT_MAX, mx[d] = -FLT_MAX;
        be_host_key_summary_rows(D, n, k, D, sum, mn, mx);
        int64_t len[3] = { -1, -1, -1 };
        for (int64_t i = 0; i < 3 * 2 * D; i++) dev[i] = NAN;
        /* the rows as one run (a page's), or cut into up to four runs, each copied elsewhere (a
         * segment's rows in several pages), the entry's count its own (not the runs' rows) */
        bd_fold f[4];
        uint16_t *part[4] = { NULL };
        int32_t runs = round % 3 == 0 ? 1 : 1 + (int32_t)(rnd() % 4), at = 0;
        if (runs > n) runs = n;
        for (int32_t j = 0; j < runs; j++) {
            int32_t rows = j == runs - 1 ? n - at : 1 + (int32_t)(rnd() % (uint32_t)(n - at - (runs - 1 - j)));
            part[j] = malloc(sizeof *part[j] * (size_t)(rows * D));
            cr_assert(part[j]);
            memcpy(part[j], k + (int64_t)at * D, sizeof *k * (size_t)(rows * D));
            f[j] = (bd_fold){ .k = part[j], .at = j ? 0 : 1, .n = rows, .runs = j ? 0 : runs, .len = j ? 0 : n + round };
            at += rows;   /* entry 1 of a list of three */
        }
        cr_assert_eq(at, n);
        for (int t = 0; t < BD_FOLD_THREADS; t++)
            for (int32_t j = 0; j < runs; j++)   /* the kernel's block a record: the others do nothing */
                for (int64_t i = t; i < D; i += BD_FOLD_THREADS) bd_fold_elem(&f[j], D, i, dev, len);
        cr_assert(!memcmp(dev + 2 * D, mn, sizeof(float) * (size_t)D) && !memcmp(dev + 3 * D, mx, sizeof(float) * (size_t)D),
                  "round %d (dim %lld, %d rows in %d runs): the fold differs from the cache's", round, (long long)D, n,
                  runs);
        cr_assert(len[1] == n + round && len[0] == -1 && len[2] == -1, "round %d: the entry's n alone written", round);
        for (int64_t i = 0; i < 2 * D; i++)
            cr_assert(isnan(dev[i]) && isnan(dev[4 * D + i]), "round %d: only the entry's floats written", round);
        for (int32_t j = 0; j < runs; j++) free(part[j]);
        free(k);
        free(ref);
        free(dev);
    }
}

/* sl_device.copy_rows of a test device whose "copies" are the pages themselves: every refuse-th
 * call says it holds none (0: never), and none of a page marked stale. */
static struct {
    int refuse, calls;
    const uint16_t *stale[64];
    int n_stale;
    /* where set: pages of page_elems halves from base, the device's copy of page i holding rows
     * [0, held[i]) under generation dev_gen[i] */
    const uint16_t *base;
    size_t page_elems;
    int n_pages;
    const int32_t *held;
    const uint64_t *dev_gen;
} copies;

static const uint16_t *test_copy(void *ud, const uint16_t *k, uint64_t gen, int32_t rows, int64_t dim)
{
    (void)ud;
    cr_assert(k && rows > 0 && gen > 0 && dim == 24, "the rows of a page folded");
    if (copies.refuse && ++copies.calls % copies.refuse == 0) return NULL;
    for (int i = 0; i < copies.n_stale; i++)
        if (copies.stale[i] == k) return NULL;
    if (copies.base) {
        size_t i = (size_t)(k - copies.base) / copies.page_elems;
        cr_assert(k >= copies.base && i < (size_t)copies.n_pages && k == copies.base + i * copies.page_elems);
        if (copies.dev_gen[i] != gen || copies.held[i] < rows) return NULL;
    }
    return k;
}

/* The folds t holds, run as the fold kernel runs them (a block a record, every thread), after the
 * batch; each first record's runs must be followed by as many records of the same entry. The
 * folds, by their first records. */
static int run_folds(const sl_table *t, const sl_list *L, int64_t D)
{
    int n = 0;
    int64_t covered = 0;
    for (int64_t j = 0; j < t->n_folds; j++) {
        const bd_fold *f = &t->folds[j];
        if (f->runs < 1) continue;
        n++;
        covered += f->runs;
        cr_assert(j + f->runs <= t->n_folds, "a fold of %d runs past the records' end", f->runs);
        for (int32_t r = 1; r < f->runs; r++)
            cr_assert(f[r].runs == 0 && f[r].at == f->at, "record %lld: a fold's runs interleaved", (long long)(j + r));
        for (int tid = 0; tid < BD_FOLD_THREADS; tid++)
            for (int64_t e = tid; e < D; e += BD_FOLD_THREADS) bd_fold_elem(f, D, e, L->dev, L->dev_n);
    }
    cr_assert_eq(covered, t->n_folds, "%lld records, %lld of them in folds", (long long)t->n_folds, (long long)covered);
    return n;
}

/* Summaries of pages (be_summary.k) are folded by the device and not sent; those of no page, or
 * refused by the device (no current copy), are sent. Through a history of pages taking rows
 * (refolded), new pages and a shape break, the list then holds every summary bit for bit and its
 * n, and the batch carried no summary the device folded. */
Test(bounds, summaries_of_pages_are_folded_where_the_pages_are_and_the_rest_sent)
{
    seed_rng("summaries_of_pages_are_folded_where_the_pages_are_and_the_rest_sent");
    enum { H = 2, D = 24, P = 8, MAXN = 60 };
    ub_batch ub = { 0 };
    sl_table t;
    sl_device dev = { NULL, h_alloc, h_release, test_copy };
    sl_init(&t, &dev, &ub);
    memset(&copies, 0, sizeof copies);
    static uint16_t rows[H][MAXN][P][D];
    static float mm[H][MAXN][3][D];        /* each page's sum (unused), minimum and maximum */
    static be_summary sum[H][MAXN];
    int64_t cnt[H] = { 0 };
    uint64_t gen = 1, shape = 5;
    for (int step = 0; step < 400; step++) {
        copies.refuse = step % 5 == 4 ? 3 : 0;
        for (int h = 0; h < H; h++) {
            /* the last page takes a row, or a page opens */
            int64_t i = cnt[h] - 1;
            if (i < 0 || sum[h][i].n == P || rnd() % 4 == 0) {
                if (cnt[h] == MAXN) continue;
                i = cnt[h]++;
                for (int d = 0; d < D; d++) mm[h][i][0][d] = 0, mm[h][i][1][d] = FLT_MAX, mm[h][i][2][d] = -FLT_MAX;
                int plain = rnd() % 5 == 0;   /* a summary of no page (SentKV's kind) */
                sum[h][i] = (be_summary){ .mn = mm[h][i][1], .mx = mm[h][i][2], .gen = ++gen, .n = 0,
                                          .k = plain ? NULL : &rows[h][i][0][0] };
            }
            be_summary *s = &sum[h][i];
            if (s->n == P) continue;
            uint16_t *row = rows[h][i][s->n];
            for (int d = 0; d < D; d++) row[d] = odd_half();
            be_host_key_summary_rows(D, 1, row, D, mm[h][i][0], mm[h][i][1], mm[h][i][2]);
            s->n++;
        }
        if (step % 97 == 96) shape++;   /* a shape break: every entry looked at again */
        static be_summary flat[H * MAXN];
        int64_t off[H + 1];
        flatten(&sum[0][0], MAXN, cnt, H, flat, off);
        be_bounds r = { .n_head_kv = H, .group = 1, .dim = D, .sum = flat, .off = off, .table = 3, .shape = shape };
        char err[128];
        uint64_t sent0 = t.sent, folded0 = t.folded;
        const sl_list *L = sl_update(&t, &r, err, sizeof err);
        cr_assert(L, "step %d: %s", step, err);
        cr_assert_eq((int64_t)(t.folded - folded0), t.n_folds, "step %d: every fold counted, a record each", step);
        /* a piece a summary sent (its minimum and maximum side by side), and one a run of their lengths */
        uint64_t pieces = (uint64_t)ub.n, sent = t.sent - sent0 - (uint64_t)t.n_folds;
        cr_assert((pieces > sent && pieces <= 2 * sent) || (pieces == 0 && sent == 0),
                  "step %d: %llu pieces for %llu summaries sent (%lld folded)", step, (unsigned long long)pieces,
                  (unsigned long long)sent, (long long)t.n_folds);
        send(&ub);
        run_folds(&t, L, D);
        cr_assert_eq(check_list(L, &r), 0, "step %d: the device's entries differ from the summaries named", step);
    }
    cr_assert(t.folded > 200 && t.sent - t.folded > 50, "both ways taken: %llu folded, %llu sent",
              (unsigned long long)t.folded, (unsigned long long)(t.sent - t.folded));
    sl_free(&t);
    ub_free(&ub);
    cr_expect_eq(live, 0, "every device allocation released");
}

/* Summaries of runs of rows in several pages (be_summary.runs: SentKV's segments) are folded from
 * every run's copy, the runs in order, the entry's count its own (not the runs' rows); one whose
 * pages the device does not all hold (a page stale, or the device saying no partway through its
 * runs) is sent whole, no record of it left among the folds. Through lists growing under one shape,
 * shape breaks and regrowths, every fold is checked against the runs of the summary it names, and
 * the list then holds every summary bit for bit. */
Test(bounds, summaries_of_runs_in_several_pages_fold_from_every_runs_copy_or_are_sent)
{
    seed_rng("summaries_of_runs_in_several_pages_fold_from_every_runs_copy_or_are_sent");
    enum { H = 2, D = 24, P = 8, NP = 12, MAXN = 150, R = 4 };
    ub_batch ub = { 0 };
    sl_table t;
    sl_device dev = { NULL, h_alloc, h_release, test_copy };
    sl_init(&t, &dev, &ub);
    memset(&copies, 0, sizeof copies);
    static uint16_t rows[H][NP][P][D];
    static uint64_t page_gen[H][NP];
    static float mm[H][MAXN][3][D];
    static be_summary_run run[H][MAXN][R];
    static be_summary sum[H][MAXN];
    uint64_t gen = 1, shape = 9;
    for (int h = 0; h < H; h++)
        for (int p = 0; p < NP; p++) {
            page_gen[h][p] = ++gen;
            for (int r = 0; r < P; r++)
                for (int d = 0; d < D; d++) rows[h][p][r][d] = odd_half();
        }
    int64_t cnt[H] = { 0 };
    uint64_t groups = 0, runs_folded = 0, multi = 0;
    static int32_t held[H * NP];
    static uint64_t dev_gen[H * NP];
    copies.base = &rows[0][0][0][0];
    copies.page_elems = (size_t)P * D;
    copies.n_pages = H * NP;
    copies.held = held;
    copies.dev_gen = dev_gen;
    for (int step = 0; step < 300; step++) {
        /* the device's copies: most whole and current, some short of the last rows (a deferred
         * row), some of another generation */
        for (int i = 0; i < H * NP; i++) {
            uint32_t c = rnd() % 8;
            held[i] = c == 0 ? (int32_t)(rnd() % P) : P;
            dev_gen[i] = c == 1 ? 0x7777 : page_gen[i / NP][i % NP];
        }
        copies.refuse = step % 7 == 6 ? 2 : 0;   /* no partway through a summary's runs */
        copies.calls = 0;
        copies.n_stale = (int)(rnd() % 4);
        for (int i = 0; i < copies.n_stale; i++) copies.stale[i] = &rows[rnd() % H][rnd() % NP][0][0];
        for (int h = 0; h < H; h++) {
            if (cnt[h] == MAXN || rnd() % 3 == 0) continue;
            int64_t i = cnt[h]++;
            int32_t n_runs = rnd() % 8 == 0 ? 0 : 1 + (int32_t)(rnd() % R);   /* 0: of no rows the device holds */
            float *sm = mm[h][i][0], *mn = mm[h][i][1], *mx = mm[h][i][2];
            for (int d = 0; d < D; d++) sm[d] = 0, mn[d] = FLT_MAX, mx[d] = -FLT_MAX;
            int64_t total = 0;
            for (int32_t j = 0; j < n_runs; j++) {
                int p = (int)(rnd() % NP), r0 = (int)(rnd() % P), n = 1 + (int)(rnd() % (uint32_t)(P - r0));
                run[h][i][j] = (be_summary_run){ &rows[h][p][0][0], page_gen[h][p], r0, n };
                be_host_key_summary_rows(D, n, &rows[h][p][r0][0], D, sm, mn, mx);
                total += n;
            }
            if (!n_runs)
                for (int d = 0; d < D; d++) mn[d] = (float)(rnd() % 100), mx[d] = mn[d] + 1;
            sum[h][i] = (be_summary){ .mn = mn, .mx = mx, .gen = ++gen, .n = total + 1 + (int64_t)(rnd() % 3),
                                      .runs = n_runs ? run[h][i] : NULL, .n_runs = n_runs };
        }
        if (step % 50 == 49) shape++;   /* every entry looked at again */
        static be_summary flat[H * MAXN];
        int64_t off[H + 1];
        flatten(&sum[0][0], MAXN, cnt, H, flat, off);
        be_bounds r = { .n_head_kv = H, .group = 1, .dim = D, .sum = flat, .off = off, .table = 4, .shape = shape };
        char err[128];
        uint64_t folded0 = t.folded;
        const sl_list *L = sl_update(&t, &r, err, sizeof err);
        cr_assert(L, "step %d: %s", step, err);
        /* each fold the runs of the summary it names, none of them in a stale page */
        for (int64_t j = 0; j < t.n_folds; j++) {
            const bd_fold *f = &t.folds[j];
            if (f->runs < 1) continue;
            int h = (int)(f->at / L->cap);
            int64_t i = f->at % L->cap;
            cr_assert(h < H && i < cnt[h], "step %d: a fold of entry %d past the list", step, f->at);
            const be_summary *sm = &flat[off[h] + i];
            cr_assert(sm->runs && f->runs == sm->n_runs && f->len == sm->n,
                      "step %d, head %d, entry %lld: a fold of %d runs, count %d, for %d runs and %lld", step, h,
                      (long long)i, f->runs, f->len, sm->n_runs, (long long)sm->n);
            for (int32_t u = 0; u < f->runs; u++) {
                const be_summary_run *w = &sm->runs[u];
                cr_assert(f[u].k == w->k + (int64_t)w->r0 * D && f[u].n == w->n,
                          "step %d, head %d, entry %lld: run %d folds other rows", step, h, (long long)i, u);
                for (int x = 0; x < copies.n_stale; x++)
                    cr_assert(copies.stale[x] != w->k, "step %d: a run of a stale page folded", step);
                const size_t pi = (size_t)(w->k - copies.base) / copies.page_elems;
                cr_assert(w->r0 + w->n <= held[pi] && dev_gen[pi] == w->gen,
                          "step %d: a run folded from a copy without its rows (%d + %d of %d held)", step, w->r0,
                          w->n, held[pi]);
            }
            runs_folded += (uint64_t)f->runs;
            multi += f->runs > 1;
        }
        send(&ub);
        int n = run_folds(&t, L, D);
        cr_assert_eq(t.folded - folded0, (uint64_t)n, "step %d: every fold counted", step);
        groups += (uint64_t)n;
        cr_assert_eq(check_list(L, &r), 0, "step %d: the device's entries differ from the summaries named", step);
    }
    memset(&copies, 0, sizeof copies);
    cr_assert(groups > 60 && multi > 30 && t.sent - t.folded > 30,
              "both ways taken: %llu folded (%llu of several runs, %llu runs), %llu sent", (unsigned long long)groups,
              (unsigned long long)multi, (unsigned long long)runs_folded, (unsigned long long)(t.sent - t.folded));
    sl_free(&t);
    ub_free(&ub);
    cr_expect_eq(live, 0, "every device allocation released");
}

/* A list unused for SL_IDLE ticks is freed (its device memory released), one in use is kept, and
 * one regrown just before the sweep is not taken for idle. */
Test(bounds, idle_device_lists_are_freed_and_used_ones_kept)
{
    enum { D = 8 };
    ub_batch ub = { 0 };
    sl_table t;
    sl_device dev = { NULL, h_alloc, h_release, NULL };
    sl_init(&t, &dev, &ub);
    static float mm[300][2][D];
    static be_summary sum[300];
    for (int i = 0; i < 300; i++) sum[i] = (be_summary){ .mn = mm[i][0], .mx = mm[i][1], .gen = (uint64_t)i + 1, .n = 1 };
    int64_t off_small[2] = { 0, 10 }, off_big[2] = { 0, 300 };
    char err[128];
    be_bounds used = { .n_head_kv = 1, .group = 1, .dim = D, .sum = sum, .off = off_small, .table = 1 };
    be_bounds idle = used;
    idle.table = 2;
    cr_assert(sl_update(&t, &used, err, sizeof err) && sl_update(&t, &idle, err, sizeof err), "%s", err);
    send(&ub);
    uint64_t both = t.bytes;
    int last = (2 * SL_IDLE - 1) / 100 * 100;   /* the last use before the sweep */
    for (int i = 1; i < 2 * SL_IDLE; i++) {
        sl_tick(&t);
        if (i % 100 == 0) {
            used.off = i == last ? off_big : off_small;   /* regrown just before a sweep */
            cr_assert(sl_update(&t, &used, err, sizeof err), "%s", err);
            send(&ub);
        }
    }
    sl_tick(&t);   /* tick 2 * SL_IDLE: the sweep */
    cr_expect_eq(live, 2, "two device allocations left: the list in use's summaries and lengths");
    uint64_t sent = t.sent;
    const sl_list *L = sl_update(&t, &used, err, sizeof err);
    cr_assert(L);
    cr_expect_eq(t.sent, sent, "the list in use kept what it had: nothing sent again");
    cr_expect_eq(t.bytes, (sizeof(float) * 2 * D + sizeof(int64_t)) * (uint64_t)L->cap, "only its bytes held (both lists: %llu)",
                 (unsigned long long)both);
    sl_free(&t);
    ub_free(&ub);
    cr_expect_eq(live, 0);
}


/* The kernel that leaves each head's best on the device (be_bounds.best bound) gives every key its
 * rank among the chosen by index (bd_rank): run for every thread of a block on the host, it writes
 * the ascending indices and the count the host gets from the same keys by sorting them. Lists of 1
 * to 256 keys, fully chosen or ending in empty slots, indices up to 100,000. */
Test(bounds, the_ids_kernels_ranks_on_the_host_give_the_sorted_indices)
{
    seed_rng("the_ids_kernels_ranks_on_the_host_give_the_sorted_indices");
    uint64_t keys[BE_PICK_MAX];
    int32_t got[BE_PICK_MAX], want[BE_PICK_MAX];
    for (int round = 0; round < 400; round++) {
        int32_t k = 1 + (int32_t)(rnd() % BE_PICK_MAX), n = round % 3 ? k : (int32_t)(rnd() % (uint32_t)(k + 1));
        for (int32_t i = 0; i < k; i++) {
            int32_t id;
            int fresh;
            do {   /* distinct indices, in the pick's order of some values */
                id = (int32_t)(rnd() % 100000);
                fresh = 1;
                for (int32_t j = 0; j < i; j++) fresh &= want[j] != id;
            } while (!fresh);
            want[i] = id;
            keys[i] = i < n ? lp_key((float)(k - i) * 0.5f, id) : 0;
        }
        for (int32_t i = 0; i < k; i++) got[i] = -1;
        int32_t count = 0;
        for (int32_t i = 0; i < k; i++) {   /* every thread of the block */
            int32_t r = bd_rank(keys, k, i);
            if (r >= 0) {
                cr_assert(r < k && got[r] == -1, "round %d: rank %d given twice or out of range", round, r);
                got[r] = lp_key_id(keys[i]);
                count++;
            }
        }
        cr_assert_eq(count, n, "round %d: %d chosen, %d keys", round, count, n);
        /* the host's way: the ids of the keys up to the first empty one, sorted */
        for (int32_t i = 1; i < n; i++)
            for (int32_t j = i; j > 0 && want[j - 1] > want[j]; j--) {
                int32_t t = want[j];
                want[j] = want[j - 1];
                want[j - 1] = t;
            }
        cr_assert(!memcmp(got, want, sizeof(int32_t) * (size_t)n), "round %d: the indices differ", round);
    }
}

/* The last block of bound_best_kernel, every thread of it on the host: a head's keys (bd_best_key)
 * sorted by sg_sort_step's steps, the first k ranked by bd_rank; the count and ascending indices the
 * pick gives (ref_best: every key sorted on the host). */
static int32_t fused_best(const float *u, int64_t n, int32_t k, int32_t *best)
{
    const int32_t size = sg_sort_size(n), kk = k < size ? k : size;
    uint64_t *keys = malloc(sizeof *keys * (size_t)size);
    cr_assert(keys);
    for (int32_t i = 0; i < size; i++) keys[i] = i < n ? bd_best_key(u[i], i) : 0;
    for (int32_t w = 2; w <= size; w <<= 1)
        for (int32_t j = w >> 1; j > 0; j >>= 1)
            for (int32_t i = 0; i < size; i++) sg_sort_step(keys, w, j, i);   /* the block's threads, a barrier after */
    int32_t chosen = 0;
    for (int32_t t = 0; t < BD_THREADS; t++) {
        const int32_t r = t < kk ? bd_rank(keys, kk, t) : -1;
        if (r < 0) continue;
        cr_assert(r < k, "rank %d of %d", r, k);
        best[r] = lp_key_id(keys[t]);
        chosen++;
    }
    free(keys);
    return chosen;
}

/* Quest's bounds and best in one launch (bound_best_kernel): its last block's work, run on the
 * host, chooses the pick's set: rows of bounds with ties, zeros of both signs, NaNs, infinities
 * (-inf never chosen), fewer choosable than k, 1 to 8,192 summaries, k 1 to BE_PICK_MAX; and over
 * the bound kernel's bounds (its threads on the host) it gives the CPU backend's best. */
Test(bounds, the_fused_kernels_last_block_on_the_host_chooses_the_picks_best)
{
    seed_rng("the_fused_kernels_last_block_on_the_host_chooses_the_picks_best");
    static const int64_t ns[] = { 1, 2, 3, 31, 64, 255, 1000, 2047, 4096, 8192 };
    int32_t got[BE_PICK_MAX], want[BE_PICK_MAX];
    for (int round = 0; round < 60; round++) {
        const int64_t n = ns[round % 10];
        const int32_t k = round % 4 == 0 ? BE_PICK_MAX : 1 + (int32_t)(rnd() % BE_PICK_MAX);
        float *u = malloc(sizeof(float) * (size_t)n);
        cr_assert(u);
        for (int64_t i = 0; i < n; i++) {
            uint32_t c = rnd() % 20;
            u[i] = c == 0 ? NAN : c == 1 ? -INFINITY : c == 2 ? INFINITY : c == 3 ? -0.0f : c == 4 ? 0.0f
                 : c < 9 ? (float)(int)(rnd() % 5)   /* ties */
                         : frand(-4, 4);
            if (round % 7 == 6) u[i] = i % 3 ? -INFINITY : u[i];   /* fewer choosable than k */
        }
        int32_t nw = ref_best(u, n, k, want), ng = fused_best(u, n, k, got);
        cr_assert_eq(ng, nw, "round %d (n %lld, k %d): %d chosen, the pick %d", round, (long long)n, k, ng, nw);
        cr_assert(!memcmp(got, want, sizeof(int32_t) * (size_t)nw), "round %d (n %lld, k %d): the indices differ",
                  round, (long long)n, k);
        free(u);
    }
    /* over real bounds: the bound kernel's threads, then the last block, against the CPU backend */
    char err[256];
    be_backend *b = be_cpu_create(1, err, sizeof err);
    cr_assert(b, "%s", err);
    for (int round = 0; round < 6; round++) {
        int64_t cnt[4] = { 1 + (int64_t)(rnd() % 900), 1 + (int64_t)(rnd() % 900), 1 + (int64_t)(rnd() % 900), 5 };
        rig r;
        rig_make(&r, 4, 1 + (int)(rnd() % 4), round % 2 ? 128 : 80, cnt);
        int64_t stride = 1;
        for (int h = 0; h < r.H; h++) stride = cnt[h] > stride ? cnt[h] : stride;
        const int64_t cap = stride + 3;
        float *dev = device_layout(&r, cap), *u = malloc(sizeof(float) * (size_t)(r.H * stride));
        cr_assert(u);
        run_bound_kernel(&r, dev, cap, stride, u);
        const int32_t k = 1 + (int32_t)(rnd() % 64);
        int32_t best[4 * 64], n_best[4];
        be_bounds q = { .q = r.q, .n_head_kv = r.H, .group = r.G, .dim = r.dim, .sum = r.sum, .off = r.off, .k = k,
                        .best = best, .n_best = n_best };
        b->ops->bound_pages(b, &q);
        for (int h = 0; h < r.H; h++) {
            int32_t ng = fused_best(u + bd_out_at(h, stride, 0), cnt[h], k, got);
            cr_assert_eq(ng, n_best[h], "round %d head %d: %d chosen, the CPU %d", round, h, ng, n_best[h]);
            cr_assert(!memcmp(got, best + h * k, sizeof(int32_t) * (size_t)ng), "round %d head %d: the indices differ",
                      round, h);
        }
        free(dev);
        free(u);
        rig_free(&r);
    }
    be_free(b);
}

Test(bounds, the_score_kernels_lanes_on_the_host_give_the_cpus_scores_bit_for_bit)
{
    /* Rows of every length from 1 to 300 (whole 32-element blocks, 8-element blocks and tails of
     * every size), values spread over many binades with some -0 (so that any other order of
     * additions shows): each row's 32 lanes and the pairwise steps run on the host equal the CPU
     * backend's score bit for bit. */
    seed_rng("the_score_kernels_lanes_on_the_host_give_the_cpus_scores_bit_for_bit");
    char err[256];
    be_backend *b = be_cpu_create(2, err, sizeof err);
    cr_assert(b, "%s", err);
    enum { ROWS = 20 };
    int bad = 0, differ_plain = 0;
    for (int64_t dim = 1; dim <= 300; dim++) {
        float *m = malloc(sizeof(float) * (size_t)(ROWS * dim)), *x = malloc(sizeof(float) * (size_t)dim);
        float want[ROWS];
        cr_assert(m && x);
        for (int64_t i = 0; i < ROWS * dim; i++) {
            m[i] = ldexpf(frand(-1.0f, 1.0f), (int)(rnd() % 24) - 12);
            if (rnd() % 50 == 0) m[i] = -0.0f;
        }
        for (int64_t i = 0; i < dim; i++) x[i] = ldexpf(frand(-1.0f, 1.0f), (int)(rnd() % 24) - 12);
        b->ops->scores(b, m, ROWS, dim, x, want);
        for (unsigned blk = 0; blk * SC_ROWS_PER_BLOCK < ROWS; blk++) {
            float v[SC_ROWS_PER_BLOCK][SC_LANES];
            for (unsigned t = 0; t < SC_THREADS; t++) {
                int64_t r = sc_row(blk, t);
                if (r < ROWS) v[t / SC_LANES][t % SC_LANES] = sc_lane_sum(m + r * dim, x, dim, (int)(t % SC_LANES));
            }
            for (int w = 0; w < SC_ROWS_PER_BLOCK; w++) {
                int64_t r = sc_row(blk, (unsigned)(w * SC_LANES));
                if (r >= ROWS) continue;
                for (int k = 0; k < SC_N_STRIDES; k++) sc_tree_step(v[w], sc_stride(k));
                bad += memcmp(&v[w][0], &want[r], sizeof(float)) != 0;
                float plain = 0.0f;   /* the same terms in element order: differs somewhere, or the test shows nothing */
                for (int64_t i = 0; i < dim; i++) plain = fmaf(m[r * dim + i], x[i], plain);
                differ_plain += memcmp(&plain, &want[r], sizeof(float)) != 0;
            }
        }
        free(m);
        free(x);
    }
    cr_expect_eq(bad, 0, "%d of %d scores differ from the CPU's", bad, 300 * ROWS);
    cr_expect_gt(differ_plain, 1000, "only %d scores depend on the order of additions", differ_plain);
    be_free(b);
}
