/* links_bench.c - Chelsea's soft matching (be_ops.soft_links), one pass as the trigger makes it while
 * a prompt is replayed: a head holding budget + gap + 1 rows (the default model's 8K prompt at
 * budget 0.2: 1,638 + 64 + 1), the 16 sinks and 64 recent rows aside, chunks of 256, at head
 * dimension 256 (the default model) and 128 (the 7B shape). Each line: milliseconds a pass (the
 * median of 7 after one) for the search chelsea.c ran before the op (each key's norm once a pass,
 * four pairs' sums side by side, one thread), then the op on 1 thread and on the given threads
 * (default: every core). Every link and cosine is the same (checked here too). An 8K prompt at
 * budget 0.2 makes about 100 such passes a KV head and global layer: the last lines time that whole
 * replay of one KV head (be_ops.merge_heads: 8,192 rows merged back to 1,638 each time 64 more
 * have arrived), once on 1 thread and once on the given threads.
 * Usage: links_bench [threads] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_time.h"
#include "kernels/backend.h"

enum { ROWS = 1638 + 64 + 1, SINKS = 16, RECENT = 64, CHUNK = 256 };

/* The search before the op: norms once, then for every A row the B rows four at a time. */
static void before_op(const be_links *l, double *nrm)
{
    const int64_t D = l->dim;
    for (int64_t t = l->m0; t < l->m1; t++) {
        double n = 0;
        for (int64_t i = 0; i < D; i++) n += (double)l->k[t * D + i] * l->k[t * D + i];
        nrm[t] = n;
    }
    for (int64_t c0 = l->m0; c0 < l->m1; c0 += l->chunk) {
        const int64_t c1 = c0 + l->chunk < l->m1 ? c0 + l->chunk : l->m1;
        for (int64_t a = c0; a < c1; a += 2) {
            const float *x = l->k + a * D;
            float bs = -2;
            int64_t best = -1, b = c0 + 1;
            for (; b + 6 < c1; b += 8) {
                const float *y0 = l->k + b * D, *y1 = y0 + 2 * D, *y2 = y0 + 4 * D, *y3 = y0 + 6 * D;
                double d[4] = { 0, 0, 0, 0 };
                for (int64_t i = 0; i < D; i++) {
                    double xi = (double)x[i];
                    d[0] += xi * y0[i];
                    d[1] += xi * y1[i];
                    d[2] += xi * y2[i];
                    d[3] += xi * y3[i];
                }
                for (int j = 0; j < 4; j++) {
                    double ny = nrm[b + 2 * j];
                    float s = nrm[a] > 0 && ny > 0 ? (float)(d[j] / sqrt(nrm[a] * ny)) : 0.0f;
                    if (s > bs) {
                        bs = s;
                        best = b + 2 * j;
                    }
                }
            }
            for (; b < c1; b += 2) {
                double d = 0;
                for (int64_t i = 0; i < D; i++) d += (double)x[i] * l->k[b * D + i];
                float s = nrm[a] > 0 && nrm[b] > 0 ? (float)(d / sqrt(nrm[a] * nrm[b])) : 0.0f;
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

static double time_op(be_backend *b, const be_links *l, int reps)
{
    double t[7];
    be_soft_links(b, l);
    for (int i = 0; i < reps; i++) {
        double t0 = bench_now_us();
        be_soft_links(b, l);
        t[i] = (bench_now_us() - t0) / 1e3;
    }
    return bench_median(t, reps);
}

static int run_dim(be_backend *one, be_backend *all, int64_t D)
{
    const int64_t n = ROWS - SINKS - RECENT;
    float *k = malloc(sizeof(float) * (size_t)(ROWS * D)), *sim = malloc(sizeof(float) * (size_t)n),
          *want_sim = malloc(sizeof(float) * (size_t)n);
    int64_t *best = malloc(sizeof(int64_t) * (size_t)n), *want = malloc(sizeof(int64_t) * (size_t)n);
    double *nrm = malloc(sizeof(double) * ROWS);
    if (!k || !sim || !want_sim || !best || !want || !nrm) {
        fprintf(stderr, "links_bench: out of memory\n");
        return 1;
    }
    for (int64_t i = 0; i < ROWS * D; i++) k[i] = bench_frand();
    be_links l = { k, D, SINKS, ROWS - RECENT, CHUNK, want, want_sim };
    double tb[7];
    for (int i = 0; i < 7; i++) {
        double t0 = bench_now_us();
        before_op(&l, nrm);
        tb[i] = (bench_now_us() - t0) / 1e3;
    }
    l.best = best;
    l.sim = sim;
    double t_before = bench_median(tb, 7), t1 = time_op(one, &l, 7), ta = time_op(all, &l, 7);
    for (int64_t i = 0; i < n; i += 2)   /* A rows: even offsets from the sinks (chunks of an even size) */
        if (best[i] != want[i] || memcmp(&sim[i], &want_sim[i], sizeof(float))) {
            fprintf(stderr, "links_bench: row %lld: the op links %lld (%.9g), the search before it %lld (%.9g)\n",
                    (long long)(i + SINKS), (long long)best[i], (double)sim[i], (long long)want[i], (double)want_sim[i]);
            return 1;
        }
    printf("head dimension %lld: %lld rows matched in chunks of %d\n", (long long)D, (long long)n, CHUNK);
    printf("  %-34s %10.3f ms a pass\n", "before the op, 1 thread", t_before);
    printf("  %-34s %10.3f ms a pass\n", "op, 1 thread", t1);
    char what[64];
    snprintf(what, sizeof what, "op, %d threads", all->n_threads);
    printf("  %-34s %10.3f ms a pass\n", what, ta);
    free(k);
    free(sim);
    free(want_sim);
    free(best);
    free(want);
    free(nrm);
    return 0;
}

/* One KV head's 8K prompt replayed to the budget (the default model's at 0.2), seconds. */
static double time_replay(be_backend *b, int64_t D)
{
    enum { N = 8192 };
    float *k = malloc(sizeof(float) * N * (size_t)D), *v = malloc(sizeof(float) * N * (size_t)D),
          *deg = malloc(sizeof(float) * N);
    int32_t *pos = malloc(sizeof(int32_t) * N);
    if (!k || !v || !deg || !pos) abort();
    for (int64_t i = 0; i < N * D; i++) {
        k[i] = bench_frand();
        v[i] = bench_frand();
    }
    for (int i = 0; i < N; i++) {
        deg[i] = 1;
        pos[i] = i;
    }
    be_merge_head h = { k, v, pos, deg, N };
    be_merge m = { .heads = &h, .n_heads = 1, .dim = D, .target = 1638, .gap = 64, .sinks = SINKS, .recent = RECENT,
                   .chunk = CHUNK, .replay = 1 };
    double t0 = bench_now_us();
    if (be_merge_heads(b, &m) != 0 || h.n != 1638) abort();
    double t = (bench_now_us() - t0) / 1e6;
    free(k);
    free(v);
    free(deg);
    free(pos);
    return t;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    char err[256];
    be_backend *one = be_cpu_create(1, err, sizeof err), *all = be_cpu_create(threads, err, sizeof err);
    if (!one || !all) {
        fprintf(stderr, "links_bench: %s\n", err);
        return 1;
    }
    int rc = run_dim(one, all, 256) || run_dim(one, all, 128);
    for (int64_t D = 256; D >= 128 && !rc; D /= 2)
        printf("a KV head's 8K replay, dimension %lld: %.3f s on 1 thread, %.3f s on %d\n", (long long)D,
               time_replay(one, D), time_replay(all, D), all->n_threads);
    be_free(one);
    be_free(all);
    return rc;
}
