/* test_pick_kernels.c - the CUDA backend's pick (kernels/pick_kernels.h) run on the host: every
 * block and thread of its launches, in the order the kernels' barriers allow, against the CPU
 * backend's pick: the same candidates in the same order, the entropy within rounding (the slices'
 * sums are added in another order than the CPU's). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/pick_kernels.h"

/* The launches of cuda_pick on the host: the k best keys into best[k], the entropy into h, vh. */
static void simulate(const float *logits, int64_t n, const int32_t *pen, int32_t n_pen, float penalty, int32_t k,
                     int entropy, float temp, uint64_t *best, double *h, double *vh)
{
    int64_t blocks[9];
    int rounds = pk_plan(n, k, blocks);
    uint64_t *lists = calloc((size_t)(blocks[0] * k), sizeof *lists), *next = calloc((size_t)(blocks[0] * k), 8);
    float *slice_max = malloc(sizeof(float) * (size_t)blocks[0]);
    uint64_t keys[PK_SLICE];
    for (int64_t b = 0; b < blocks[0]; b++) {   /* pick_slice_kernel */
        int64_t base = b * PK_SLICE;
        uint32_t bits[PK_SLICE / 32] = { 0 };
        for (int32_t j = 0; j < n_pen; j++) {
            int64_t o = pen[j] - base;
            if (o >= 0 && o < PK_SLICE) bits[o >> 5] |= 1u << (o & 31);
        }
        float mx = -INFINITY;
        for (int tid = 0; tid < PK_THREADS; tid++)
            for (int r = 0; r < PK_PER_THREAD; r++) {
                float raw;
                int slot = tid + r * PK_THREADS;
                keys[slot] = pk_token_key(logits, n, bits, penalty, base, slot, &raw);
                mx = fmaxf(mx, raw);
            }
        for (int size = 2; size <= PK_SLICE; size <<= 1)
            for (int stride = size / 2; stride > 0; stride >>= 1)
                for (int tid = 0; tid < PK_THREADS; tid++) pk_sort_step(keys, size, stride, tid);
        memcpy(lists + b * k, keys, sizeof(uint64_t) * (size_t)k);
        slice_max[b] = mx;
    }
    for (int r = 1; r <= rounds; r++) {   /* pick_merge_kernel */
        for (int64_t b = 0; b < blocks[r]; b++) {
            for (int tid = 0; tid < PK_THREADS; tid++)
                for (int q = 0; q < PK_PER_THREAD; q++) {
                    int slot = tid + q * PK_THREADS;
                    keys[slot] = pk_merge_key(lists, blocks[r - 1], k, b * (PK_SLICE / k), slot);
                }
            for (int size = 2; size <= PK_SLICE; size <<= 1)
                for (int stride = size / 2; stride > 0; stride >>= 1)
                    for (int tid = 0; tid < PK_THREADS; tid++) pk_sort_step(keys, size, stride, tid);
            memcpy(next + b * k, keys, sizeof(uint64_t) * (size_t)k);
        }
        uint64_t *t = lists;
        lists = next;
        next = t;
    }
    memcpy(best, lists, sizeof(uint64_t) * (size_t)k);
    *h = *vh = 0;
    if (entropy) {   /* pick_entropy_kernel, pick_entropy_finish */
        float mx = -INFINITY;
        for (int64_t b = 0; b < blocks[0]; b++) mx = fmaxf(mx, slice_max[b]);
        double total[3] = { 0, 0, 0 };
        static double acc[PK_THREADS][3];
        for (int64_t b = 0; b < blocks[0]; b++) {
            for (int tid = 0; tid < PK_THREADS; tid++) {
                double a[3] = { 0, 0, 0 };
                if (isfinite(mx)) pk_entropy_thread(logits, n, b * PK_SLICE, tid, mx, 1.0f / (temp > 0 ? temp : 1), a);
                memcpy(acc[tid], a, sizeof a);
            }
            for (int s = PK_THREADS / 2; s > 0; s >>= 1)
                for (int tid = 0; tid < PK_THREADS; tid++) pk_tree_step(acc, s, tid);
            for (int j = 0; j < 3; j++) total[j] += acc[0][j];
        }
        if (isfinite(mx)) lp_entropy_finish(total, h, vh);
    }
    free(lists);
    free(next);
    free(slice_max);
}

static uint64_t rng_state = 3;
static uint32_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

Test(pick_kernels, the_launches_give_the_cpu_picks_candidates_and_its_entropy_within_rounding, .timeout = 120)
{
    char err[256];
    be_backend *cpu = be_cpu_create(1, err, sizeof err);
    cr_assert(cpu, "%s", err);
    const int64_t sizes[] = { 1, 37, 2048, 2049, 32000, 262144 };
    const int32_t ks[] = { 1, 40, 256, 3 };
    float *row = malloc(sizeof(float) * 262144), *capped = malloc(sizeof(float) * 262144);
    int32_t pen[512];
    for (int round = 0; round < 24; round++) {
        int64_t n = sizes[round % 6];
        int32_t k = ks[(round / 6) % 4];
        for (int64_t i = 0; i < n; i++) {   /* ties on a coarse grid every other round, special values */
            float v = round % 2 ? (float)((int)(rnd() % 32) - 16) * 0.25f : ((float)rnd() / 2147483648.0f - 1.0f) * 20;
            uint32_t r = rnd() % 500;
            row[i] = r == 0 ? NAN : r == 1 ? -INFINITY : r == 2 ? -0.0f : v;
        }
        if (round == 5) row[77] = INFINITY;   /* the entropy of a row with +inf is 0 */
        if (round == 9)
            for (int64_t i = 0; i < n; i++) row[i] = -INFINITY;   /* no candidate at all */
        int32_t n_pen = 0;
        for (int64_t i = (int64_t)(rnd() % 50); i < n && n_pen < 512; i += 1 + (int64_t)(rnd() % 400)) pen[n_pen++] = (int32_t)i;
        float cap = round % 3 == 1 ? 25.0f : 0.0f, penalty = round % 4 == 3 ? 0.8f : 1.4f, temp = round % 5 ? 0.7f : 0.0f;
        float val[BE_PICK_MAX];
        int32_t id[BE_PICK_MAX];
        /* the launches after pick_softcap_kernel, on the row it leaves */
        for (int64_t i = 0; i < n; i++) capped[i] = cap > 0 ? lp_cap(row[i], cap) : row[i];
        be_pick p = { row, (int32_t)n, cap, pen, n_pen, penalty, k, 1, temp, val, id, 0, 0, 0 };
        cpu->ops->pick(cpu, &p, 1);
        uint64_t best[BE_PICK_MAX];
        double h, vh;
        simulate(capped, n, pen, n_pen, penalty, k, 1, temp, best, &h, &vh);
        int32_t got = 0;
        while (got < k && best[got]) got++;
        cr_assert_eq(got, p.n_out, "round %d (n %lld, k %d): %d candidates, the CPU %d", round, (long long)n, k, got,
                     p.n_out);
        for (int32_t i = 0; i < got; i++)
            cr_assert(lp_key_id(best[i]) == id[i] && lp_key_value(best[i]) == val[i],
                      "round %d: candidate %d is %d, the CPU's %d", round, i, lp_key_id(best[i]), id[i]);
        cr_assert(fabs(h - p.h) <= 1e-12 * fmax(1, fabs(p.h)) && fabs(vh - p.vh) <= 1e-12 * fmax(1, fabs(p.vh)),
                  "round %d: entropy %.17g / %.17g, the CPU %.17g / %.17g", round, h, vh, p.h, p.vh);
        if (round == 5 || round == 9) cr_assert(h == 0 && vh == 0 && p.h == 0, "round %d: %g %g %g", round, h, vh, p.h);
        else if (n > 1) cr_assert(p.h > 0, "round %d: the entropy went untested", round);
    }
    free(row);
    free(capped);
    be_free(cpu);
}

Test(pick_kernels, the_plan_ends_in_one_list)
{
    for (int64_t n = 1; n < 20000000; n = n * 3 + 1)
        for (int32_t k = 1; k <= BE_PICK_MAX; k = k * 2 + 1) {
            int64_t blocks[9];
            int rounds = pk_plan(n, k, blocks);
            cr_assert(rounds <= 8 && blocks[rounds] == 1 && blocks[0] * PK_SLICE >= n, "n %lld k %d", (long long)n, k);
            for (int r = 1; r <= rounds; r++) cr_assert(blocks[r] * (PK_SLICE / k) >= blocks[r - 1]);
        }
}
