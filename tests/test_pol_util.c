/* The policies' top-k (engine/policy/pol_util.c pol_top_k64: a quickselect and one pass) and their
 * lazy ranking (pol_ranking) against the order written plainly: every index sorted by score,
 * larger first, equal scores (-0 and +0 alike) by index, lower first, NaN as -inf; the first k,
 * ascending. Scores drawn from a few values, so ties, infinities and NaN are common; inputs
 * already in order and reversed (a quickselect's worst shapes); every k from 0 to past n. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/policy/pol_util.h"

static uint64_t next(uint64_t *r)
{
    *r = *r * 6364136223846793005ull + 1442695040888963407ull;
    return *r >> 33;
}

static const float *plain_score;

static float plain_value(float v) { return v != v ? -INFINITY : v; }

static int plain_order(const void *a, const void *b)
{
    int64_t i = *(const int64_t *)a, j = *(const int64_t *)b;
    float si = plain_value(plain_score[i]), sj = plain_value(plain_score[j]);
    if (si > sj) return -1;
    if (si < sj) return 1;
    return (i > j) - (i < j);
}

static int ascending(const void *a, const void *b)
{
    int64_t i = *(const int64_t *)a, j = *(const int64_t *)b;
    return (i > j) - (i < j);
}

/* Every index in the plain order, into order[0..n). */
static void plain_ranking(const float *score, int64_t n, int64_t *order)
{
    for (int64_t i = 0; i < n; i++) order[i] = i;
    plain_score = score;
    qsort(order, (size_t)n, sizeof *order, plain_order);
}

static void fill(uint64_t *r, float *score, int64_t n, int shape)
{
    static const float few[] = { 0.0f, -0.0f, 1.0f, -1.0f, 0.5f, INFINITY, -INFINITY, NAN, 3e-8f, -2.5f };
    for (int64_t i = 0; i < n; i++) {
        if (shape == 0) score[i] = few[next(r) % 10];
        else if (shape == 1) score[i] = (float)(next(r) % 100000) * 1e-5f;
        else if (shape == 2) score[i] = (float)i;            /* ascending */
        else if (shape == 3) score[i] = (float)(n - i);      /* descending */
        else score[i] = 1.0f;                                /* all equal */
    }
}

Test(pol_util, the_top_k_is_the_plain_orders_first_k_ascending)
{
    uint64_t r = 7;
    int cases = 0;
    for (int round = 0; round < 400; round++) {
        int shape = round % 5;
        int64_t n = round < 20 ? round : 1 + (int64_t)(next(&r) % (round % 7 == 0 ? 5000 : 300));
        float *score = malloc(sizeof(float) * (size_t)(n + 1));
        int64_t *order = malloc(sizeof(int64_t) * (size_t)(n + 1)), *out = malloc(sizeof(int64_t) * (size_t)(n + 1));
        int64_t *want = malloc(sizeof(int64_t) * (size_t)(n + 1));
        cr_assert(score && order && out && want);
        fill(&r, score, n, shape);
        plain_ranking(score, n, order);
        const int64_t ks[5] = { 0, 1, n / 2, n, n + 2 };
        for (int ki = 0; ki < 6; ki++) {
            int64_t k = ki < 5 ? ks[ki] : (int64_t)(next(&r) % (uint64_t)(n + 1));
            int64_t kk = k < n ? k : n;
            memcpy(want, order, sizeof(int64_t) * (size_t)kk);
            qsort(want, (size_t)kk, sizeof *want, ascending);
            int64_t got = pol_top_k64(score, n, k, out);
            cr_assert_eq(got, kk, "round %d (n %lld, shape %d), k %lld: %lld indices", round, (long long)n, shape,
                         (long long)k, (long long)got);
            cr_assert(!memcmp(out, want, sizeof(int64_t) * (size_t)kk),
                      "round %d (n %lld, shape %d), k %lld: not the plain order's first k", round, (long long)n, shape,
                      (long long)k);
            cases++;
        }
        free(score);
        free(order);
        free(out);
        free(want);
    }
    cr_assert(cases == 2400);
}

Test(pol_util, the_lazy_ranking_gives_the_plain_order)
{
    uint64_t r = 11;
    for (int round = 0; round < 100; round++) {
        int shape = round % 5;
        int64_t n = (int64_t)(next(&r) % 700);
        float *score = malloc(sizeof(float) * (size_t)(n + 1));
        int64_t *order = malloc(sizeof(int64_t) * (size_t)(n + 1));
        uint64_t *heap = malloc(sizeof(uint64_t) * (size_t)(n + 1));
        cr_assert(score && order && heap);
        fill(&r, score, n, shape);
        plain_ranking(score, n, order);
        pol_ranking rk;
        pol_rank_begin(&rk, score, n, heap);
        for (int64_t i = 0; i < n; i++) {
            int64_t got = pol_rank_next(&rk);
            cr_assert_eq(got, order[i], "round %d (n %lld, shape %d): rank %lld is %lld, not %lld", round,
                         (long long)n, shape, (long long)i, (long long)got, (long long)order[i]);
        }
        cr_assert_eq(pol_rank_next(&rk), -1);
        free(score);
        free(order);
        free(heap);
    }
}
