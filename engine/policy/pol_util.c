/* pol_util.c - top-k selection for the policies (see pol_util.h). */
#include "pol_util.h"

#include <stdlib.h>

/* qsort has no context argument; the score array of the current call lives here. Policies run on
 * the engine's single control thread, so one static is enough. */
static const float *cmp_score;

static int by_score_desc(const void *a, const void *b)
{
    int i = *(const int *)a, j = *(const int *)b;
    float si = cmp_score[i], sj = cmp_score[j];
    if (si > sj) return -1;
    if (si < sj) return 1;
    return (i > j) - (i < j);
}

static int by_index(const void *a, const void *b)
{
    int i = *(const int *)a, j = *(const int *)b;
    return (i > j) - (i < j);
}

int pol_top_k(int *idx, int n, const float *score, int k)
{
    if (k > n) k = n;
    if (k <= 0) return 0;
    if (k < n) {
        cmp_score = score;
        qsort(idx, (size_t)n, sizeof *idx, by_score_desc);
    }
    qsort(idx, (size_t)k, sizeof *idx, by_index);
    return k;
}
