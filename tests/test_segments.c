/* SentKV's choice of whole segments (be_bounds.bits, kernels/segment_kernels.h): the CPU backend's
 * against the policy's walk written plainly (every key sorted, then taken in order), and the CUDA
 * kernel's steps (seg_choose_kernel) run on the host for every thread of its block, in its phases,
 * against the CPU's choice. Bounds with ties, NaN, infinities; lengths, budgets, sinks and tails
 * from nothing left to everything fitting. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/logit_pick.h"
#include "kernels/backend.h"
#include "kernels/segment_kernels.h"
#include "tests/test_rng.h"

static void seed_rng(const char *what) { test_rng_seed(what, "SEGMENTS_SEED", (uint64_t)time(NULL) * 2654435761u); }

static int by_key_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x < y) - (x > y);
}

/* The policy's walk as it was written before the op: every segment ranked (a full sort), each taken
 * whole where it fits in the room left, stopping once the room left is below the shortest. */
static void plain_choice(const float *u, const int64_t *ln, int64_t n, int64_t budget, int64_t sinks, int64_t len,
                         uint64_t *bm, int64_t words)
{
    int64_t covered = 0, shortest = INT64_MAX;
    int64_t *at = malloc(sizeof(int64_t) * (size_t)(n + 1));
    uint64_t *keys = malloc(sizeof(uint64_t) * (size_t)(n + 1));
    for (int64_t i = 0; i < n; i++) {
        at[i] = covered;
        covered += ln[i];
        if (ln[i] < shortest) shortest = ln[i];
        keys[i] = lp_key(isnan(u[i]) ? -INFINITY : u[i], (int32_t)i);
    }
    qsort(keys, (size_t)n, sizeof *keys, by_key_desc);
    memset(bm, 0, sizeof(uint64_t) * (size_t)words);
    for (int64_t p = 0; p < len; p++)
        if (p < sinks || p >= covered) bm[p >> 6] |= 1ull << (p & 63);
    int64_t room = budget - (len - covered) - (sinks < covered ? sinks : covered), used = 0;
    for (int64_t r = 0; r < n && used < room && room - used >= shortest; r++) {
        int32_t i = lp_key_id(keys[r]);
        if (used + ln[i] > room) continue;
        for (int64_t p = at[i]; p < at[i] + ln[i]; p++) bm[p >> 6] |= 1ull << (p & 63);
        used += ln[i];
    }
    free(at);
    free(keys);
}

/* seg_choose_kernel for one head with nt threads, phase by phase as the block runs them (a phase's
 * threads one after another: within a phase no thread reads what another writes, but for the
 * atomics, whose order does not matter). */
static void kernel_choice(const float *u, const int64_t *ln, int64_t n, int64_t budget, int64_t sinks, int64_t len,
                          uint64_t *bm, int64_t words, int nt)
{
    int32_t size = sg_sort_size(n);
    uint64_t *keys = malloc(sizeof(uint64_t) * (size_t)size);
    int64_t *start = malloc(sizeof(int64_t) * (size_t)(n + 1)), *by_rank = malloc(sizeof(int64_t) * (size_t)(n + 1));
    int64_t *tsum = malloc(sizeof(int64_t) * (size_t)nt), *tpre = malloc(sizeof(int64_t) * (size_t)nt);
    for (int64_t w = 0; w < words; w++) bm[w] = 0;
    for (int32_t i = 0; i < size; i++) keys[i] = i < n ? sg_key(u[i], i) : 0;
    int64_t shortest = INT64_MAX, first_out = n, covered = 0;
    for (int t = 0; t < nt; t++) {   /* the chunks' sums and minimum */
        int64_t a, b, sum = 0;
        sg_chunk(n, t, nt, &a, &b);
        for (int64_t i = a; i < b; i++) {
            sum += ln[i];
            if (ln[i] < shortest) shortest = ln[i];
        }
        tsum[t] = sum;
    }
    for (int t = 0; t < nt; t++) {   /* the block's scan */
        tpre[t] = covered;
        covered += tsum[t];
    }
    for (int t = 0; t < nt; t++) {
        int64_t a, b, p = tpre[t];
        sg_chunk(n, t, nt, &a, &b);
        for (int64_t i = a; i < b; i++) {
            start[i] = p;
            p += ln[i];
        }
    }
    for (int32_t k = 2; k <= size; k <<= 1)
        for (int32_t j = k >> 1; j > 0; j >>= 1)
            for (int32_t i = 0; i < size; i++) sg_sort_step(keys, k, j, i);
    const int64_t room = sg_room(budget, sinks, covered, len);
    int64_t total = 0;
    for (int t = 0; t < nt; t++) {
        int64_t a, b, sum = 0;
        sg_chunk(n, t, nt, &a, &b);
        for (int64_t j = a; j < b; j++) {
            by_rank[j] = ln[lp_key_id(keys[j])];
            sum += by_rank[j];
        }
        tsum[t] = sum;
    }
    for (int t = 0; t < nt; t++) {
        tpre[t] = total;
        total += tsum[t];
    }
    for (int t = 0; t < nt; t++) {
        int64_t a, b, p = tpre[t];
        sg_chunk(n, t, nt, &a, &b);
        for (int64_t j = a; j < b; j++) {
            if (sg_first_out(p, p + by_rank[j], room, shortest)) {
                if (j < first_out) first_out = j;
                break;
            }
            p += by_rank[j];
        }
    }
    /* the ranges: as seg_set_range, a word's mask at a time */
#define SET_RANGE(A, B)                                                                                             \
    do {                                                                                                            \
        int64_t a_ = (A), b_ = (B);                                                                                 \
        if (a_ < b_)                                                                                                \
            for (int64_t w = a_ >> 6; w <= (b_ - 1) >> 6; w++) bm[w] |= bm_word_mask(a_, b_, w);                   \
    } while (0)
    SET_RANGE(0, sinks < len ? sinks : len);
    SET_RANGE(covered, len);
    for (int64_t j = 0; j < first_out; j++) {
        int32_t i = lp_key_id(keys[j]);
        SET_RANGE(start[i], start[i] + by_rank[j]);
    }
    if (first_out < n) {   /* the first warp past the run */
        int64_t used = 0;
        for (int64_t j = 0; j < first_out; j++) used += by_rank[j];
        for (int64_t j0 = first_out + 1; j0 < n && room - used >= shortest;) {
            int64_t lens[32];
            for (int l = 0; l < 32; l++) lens[l] = j0 + l < n ? by_rank[j0 + l] : -1;
            int l = sg_first_fit(lens, room, used);
            if (l < 0) {
                j0 += 32;
                continue;
            }
            int32_t i = lp_key_id(keys[j0 + l]);
            SET_RANGE(start[i], start[i] + by_rank[j0 + l]);
            used += by_rank[j0 + l];
            j0 += l + 1;
        }
    }
#undef SET_RANGE
    free(keys);
    free(start);
    free(by_rank);
    free(tsum);
    free(tpre);
}

/* A head's case: n segments with their bounds and lengths, a budget, sinks and the length. */
typedef struct seg_case {
    int64_t n, budget, sinks, len, words;
    float *u;
    int64_t *ln;
} seg_case;

static void make_case(seg_case *c, int64_t n_max)
{
    c->n = (int64_t)(rnd() % (uint32_t)(n_max + 1));
    c->u = malloc(sizeof(float) * (size_t)(c->n + 1));
    c->ln = malloc(sizeof(int64_t) * (size_t)(c->n + 1));
    int kind = (int)(rnd() % 4), lmax = 1 + (int)(rnd() % 40);
    int64_t covered = 0;
    for (int64_t i = 0; i < c->n; i++) {
        float x = frand(-50, 50);
        if (kind == 1) x = (float)(int)(x / 20);   /* many ties */
        int r = (int)(rnd() % 64);
        if (r == 0) x = NAN;
        if (r == 1) x = -INFINITY;
        if (r == 2) x = INFINITY;
        if (r == 3) x = -0.0f;
        c->u[i] = x;
        c->ln[i] = kind == 2 ? 14 : 1 + (int64_t)(rnd() % (uint32_t)lmax);
        covered += c->ln[i];
    }
    c->len = covered + (int64_t)(rnd() % 40);
    c->sinks = (int64_t)(rnd() % 3 == 0 ? 0 : rnd() % 60);
    c->budget = (int64_t)(rnd() % (uint32_t)(c->len + 2)) - (int64_t)(rnd() % 8 == 0 ? 30 : 0);
    c->words = (c->len + 63) / 64 + (int64_t)(rnd() % 3);
}

static void free_case(seg_case *c)
{
    free(c->u);
    free(c->ln);
}

Test(segments, the_cpu_choice_is_the_walk_over_every_key_sorted)
{
    seed_rng("segments");
    char err[256];
    be_backend *b = be_cpu_create(2, err, sizeof err);
    cr_assert(b, "%s", err);
    for (int round = 0; round < 300; round++) {
        enum { H = 3, D = 4 };
        seg_case c[H];
        int64_t off[H + 1] = { 0 }, words = 1, len = 0;
        for (int h = 0; h < H; h++) {
            make_case(&c[h], round < 50 ? 12 : 400);
            off[h + 1] = off[h] + c[h].n;
        }
        /* one call's heads share budget, sinks and length: the largest head's len; the others' tails grow */
        for (int h = 0; h < H; h++) {
            if (c[h].len > len) len = c[h].len;
            if (c[h].words > words) words = c[h].words;
        }
        if (words < (len + 63) / 64) words = (len + 63) / 64;
        int64_t budget = c[0].budget, sinks = c[0].sinks;
        /* summaries whose bounds are the case's u: mn = mx = (u, 0, 0, 0) against q = (1, 0, 0, 0) */
        float *mm = malloc(sizeof(float) * (size_t)(2 * D * (off[H] + 1)));
        be_summary *sum = malloc(sizeof *sum * (size_t)(off[H] + 1));
        float q[H * D] = { 0 };
        for (int h = 0; h < H; h++) {
            q[h * D] = 1.0f;
            for (int64_t i = 0; i < c[h].n; i++) {
                float *s = mm + 2 * D * (off[h] + i);
                memset(s, 0, sizeof(float) * 2 * D);
                s[0] = s[D] = c[h].u[i];
                sum[off[h] + i] = (be_summary){ .mn = s, .mx = s + D, .n = c[h].ln[i] };
            }
        }
        uint64_t *bits = malloc(sizeof(uint64_t) * (size_t)(H * words)), *want = malloc(sizeof(uint64_t) * (size_t)words);
        float *u = malloc(sizeof(float) * (size_t)(off[H] + 1));
        be_bounds r = { .q = q, .n_head_kv = H, .group = 1, .dim = D, .sum = sum, .off = off, .u = u, .bits = bits,
                        .words = words, .budget = budget, .sinks = sinks, .len = len };
        b->ops->bound_pages(b, &r);
        for (int h = 0; h < H; h++) {
            for (int64_t i = 0; i < c[h].n; i++) {   /* max(1 * u, 1 * u) + the zeros: u, NaN as it is */
                float x = c[h].u[i];
                cr_assert(isnan(x) ? isnan(u[off[h] + i]) : u[off[h] + i] == x, "round %d: bound", round);
            }
            plain_choice(c[h].u, c[h].ln, c[h].n, budget, sinks, len, want, words);
            cr_assert(!memcmp(bits + h * words, want, sizeof(uint64_t) * (size_t)words),
                      "round %d head %d: %lld segments, budget %lld, sinks %lld, len %lld: the CPU's choice is not "
                      "the plain walk's",
                      round, h, (long long)c[h].n, (long long)budget, (long long)sinks, (long long)len);
        }
        free(mm);
        free(sum);
        free(bits);
        free(want);
        free(u);
        for (int h = 0; h < H; h++) free_case(&c[h]);
    }
    be_free(b);
}

Test(segments, the_choice_kernels_threads_on_the_host_give_the_cpus_choice)
{
    seed_rng("segments kernel");
    static const int threads[] = { SG_THREADS, 33, 1, 256 };
    for (int round = 0; round < 400; round++) {
        seg_case c;
        make_case(&c, round % 10 == 0 ? 3000 : 300);
        int64_t *at = malloc(sizeof(int64_t) * (size_t)(c.n + 1)), p = 0;
        for (int64_t i = 0; i < c.n; i++) at[i] = p, p += c.ln[i];
        uint64_t *heap = malloc(sizeof(uint64_t) * (size_t)(c.n + 1));
        uint64_t *cpu = malloc(sizeof(uint64_t) * (size_t)c.words), *dev = malloc(sizeof(uint64_t) * (size_t)c.words);
        int64_t used = sg_choose(c.u, c.ln, at, c.n, c.budget, c.sinks, c.len, heap, cpu, c.words);
        cr_assert(used <= (sg_room(c.budget, c.sinks, p, c.len) > 0 ? sg_room(c.budget, c.sinks, p, c.len) : 0),
                  "round %d: the segments took %lld tokens, more than the room", round, (long long)used);
        int nt = threads[round % 4];
        kernel_choice(c.u, c.ln, c.n, c.budget, c.sinks, c.len, dev, c.words, nt);
        cr_assert(!memcmp(cpu, dev, sizeof(uint64_t) * (size_t)c.words),
                  "round %d (%d threads): %lld segments, budget %lld, sinks %lld, len %lld: the kernel's choice is "
                  "not the CPU's",
                  round, nt, (long long)c.n, (long long)c.budget, (long long)c.sinks, (long long)c.len);
        free(at);
        free(heap);
        free(cpu);
        free(dev);
        free_case(&c);
    }
}

Test(segments, a_page_mask_from_a_bitmap_is_its_tokens_bits)
{
    seed_rng("segments masks");
    for (int round = 0; round < 2000; round++) {
        enum { WORDS = 4 };
        uint64_t bm[WORDS], m[2];
        for (int w = 0; w < WORDS; w++) bm[w] = ((uint64_t)rnd() << 32) ^ rnd();
        int32_t n = 1 + (int32_t)(rnd() % 100), pos[100];
        int consecutive = round % 2;
        int32_t p0 = (int32_t)(rnd() % 300);
        for (int32_t t = 0; t < n; t++) pos[t] = consecutive ? p0 + t : (t ? pos[t - 1] : p0) + 1 + (int32_t)(rnd() % 3);
        int64_t pw = (n + 63) / 64;
        int32_t on = sg_page_mask(bm, WORDS, pos, n, m, pw), want_on = 0;
        for (int32_t t = 0; t < n; t++) {
            int bit = pos[t] < 64 * WORDS && ((bm[pos[t] >> 6] >> (pos[t] & 63)) & 1);
            want_on += bit;
            cr_assert_eq((int)((m[t >> 6] >> (t & 63)) & 1), bit, "round %d token %d", round, t);
        }
        for (int32_t t = n; t < 64 * pw; t++) cr_assert_eq((int)((m[t >> 6] >> (t & 63)) & 1), 0, "round %d past n", round);
        cr_assert_eq(on, want_on, "round %d: the count", round);
        /* the count over a range of positions, as the statistics take it for consecutive pages */
        int64_t a = (int64_t)(rnd() % 300) - 20, b = a + (int64_t)(rnd() % 200), want_n = 0;
        for (int64_t p = a; p < b; p++) want_n += p >= 0 && p < 64 * WORDS && ((bm[p >> 6] >> (p & 63)) & 1);
        cr_assert_eq(bm_count(bm, WORDS, a, b), want_n, "round %d: the set bits of [%lld, %lld)", round, (long long)a,
                     (long long)b);
    }
}

/* A word's set bits as the host counts them (bm_popcount: in registers, not libgcc's call) are its
 * bits counted one by one: every single bit, every run from either end, and random words. */
Test(segments, a_words_set_bits_are_counted_bit_by_bit)
{
    uint64_t r = 99;
    for (int i = 0; i < 20000; i++) {
        uint64_t x;
        if (i < 64)
            x = 1ull << i;
        else if (i < 129)
            x = i == 128 ? ~0ull : (1ull << (i - 64)) - 1;
        else if (i < 193)
            x = ~0ull << (i - 129);
        else {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            x = r ^ (r << 17) ^ (i % 3 ? 0 : r >> 9);
        }
        int want = 0;
        for (int b = 0; b < 64; b++) want += (int)((x >> b) & 1);
        cr_assert_eq(bm_popcount(x), want, "word %016llx", (unsigned long long)x);
    }
}
