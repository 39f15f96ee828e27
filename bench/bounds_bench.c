/* bounds_bench.c - the host's share of Quest's page selection, a layer of a decode step, before
 * and after the bounds op (kernels/backend.h, be_bounds).
 *
 * At the 7B shape (8 KV heads of 4 queries, head dimension 128, pages of 32) over 2K, 8K and 32K
 * tokens, every page but the current one bounded and each head's 32 best kept (a budget of 1024
 * tokens):
 *   per head + sort   the old path: a bounds call a KV head, then every page sorted (pol_top_k);
 *   one call          the CPU backend's bound_pages: every head in one call, the best by the
 *                     pick's heap (what the CPU runs now);
 *   device lists      what a CUDA backend does on the host for the same call: the summary list
 *                     brought up to date (kernels/summary_lists.c; host memory stands in for the
 *                     device, the batch is dropped, not sent), with the shape kept as in a decode
 *                     step (each head's last page took a row), and with no shape (every record
 *                     compared, as SentKV's lists after a rewind);
 * on one CPU thread. Each line: microseconds a layer call, the median of 50 (after 3 warm-up
 * calls); the first two give the same pages (checked).
 * Usage: bounds_bench */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_time.h"
#include "engine/policy/pol_util.h"
#include "kernels/backend.h"
#include "kernels/summary_lists.h"

enum { H = 8, G = 4, D = 128, K = 32, CALLS = 50 };

static void *h_alloc(void *ud, size_t bytes)
{
    (void)ud;
    return malloc(bytes);
}
static void h_release(void *ud, void *p)
{
    (void)ud;
    free(p);
}

int main(void)
{
    char err[256];
    be_backend *cpu = be_cpu_create(1, err, sizeof err);
    if (!cpu) {
        fprintf(stderr, "bounds_bench: %s\n", err);
        return 1;
    }
    float *q = malloc(sizeof(float) * H * G * D);
    for (int i = 0; i < H * G * D; i++) q[i] = bench_frand();
    printf("Quest's selection, a layer call: %d KV heads x %d queries, head dimension %d, top %d pages a head, "
           "1 thread\n",
           H, G, D, K);
    printf("%8s %10s %18s %12s %22s %22s\n", "context", "pages", "per head + sort", "one call", "device lists, shape",
           "device lists, none");
    static const int64_t ctxs[] = { 2048, 8192, 32768 };
    for (size_t ci = 0; ci < sizeof ctxs / sizeof *ctxs; ci++) {
        int64_t per = ctxs[ci] / 32 - 1, n = H * per;
        float *mm = malloc(sizeof(float) * (size_t)(n * 2 * D)), *u = malloc(sizeof(float) * (size_t)n);
        be_summary *sum = malloc(sizeof *sum * (size_t)n);
        int *idx = malloc(sizeof(int) * (size_t)per);
        if (!mm || !u || !sum || !idx) return 1;
        for (int64_t i = 0; i < n * 2 * D; i++) mm[i] = bench_frand();
        int64_t off[H + 1];
        for (int h = 0; h <= H; h++) off[h] = h * per;
        for (int64_t i = 0; i < n; i++)
            sum[i] = (be_summary){ .mn = mm + i * 2 * D, .mx = mm + i * 2 * D + D, .gen = (uint64_t)i + 1, .n = 32 };
        double t_old[CALLS], t_new[CALLS], t_keep[CALLS], t_none[CALLS];
        int32_t best[H * K], nb[H];
        int same = 1;
        for (int c = -3; c < CALLS; c++) {
            /* the old path */
            double t0 = bench_now_us();
            for (int h = 0; h < H; h++) {
                int64_t o1[2] = { 0, per };
                be_bounds r = { q + h * G * D, 1, G, D, sum + off[h], o1, 0, 0, 0, NULL, NULL, u + off[h], NULL, 0, 0, 0, 0, NULL };
                cpu->ops->bound_pages(cpu, &r);
                for (int i = 0; i < per; i++) idx[i] = i;
                int got = pol_top_k(idx, (int)per, u + off[h], K);
                if (c == 0 && h == 0) {   /* checked against the new path below */
                    be_bounds r2 = { q, H, G, D, sum, off, 0, 0, K, best, nb, NULL, NULL, 0, 0, 0, 0, NULL };
                    cpu->ops->bound_pages(cpu, &r2);
                    same = got == nb[0];
                    for (int i = 0; same && i < got; i++) same = idx[i] == best[i];
                }
            }
            double t1 = bench_now_us();
            be_bounds r = { q, H, G, D, sum, off, 0, 0, K, best, nb, NULL, NULL, 0, 0, 0, 0, NULL };
            cpu->ops->bound_pages(cpu, &r);
            double t2 = bench_now_us();
            if (c >= 0) t_old[c] = t1 - t0, t_new[c] = t2 - t1;
        }
        if (!same) {
            fprintf(stderr, "bounds_bench: the two paths chose different pages\n");
            return 1;
        }
        for (int mode = 0; mode < 2; mode++) {
            ub_batch ub = { 0 };
            sl_table t;
            sl_device dev = { NULL, h_alloc, h_release, NULL };
            sl_init(&t, &dev, &ub);
            for (int c = -3; c < CALLS; c++) {
                for (int h = 0; h < H; h++) sum[off[h + 1] - 1].n = 1 + (c + 3) % 32;   /* the last page took a row */
                be_bounds r = { q, H, G, D, sum, off, 9, mode == 0 ? 5 : 0, K, best, nb, NULL, NULL, 0, 0, 0, 0, NULL };
                double t0 = bench_now_us();
                if (!sl_update(&t, &r, err, sizeof err)) {
                    fprintf(stderr, "bounds_bench: %s\n", err);
                    return 1;
                }
                double t1 = bench_now_us();
                ub_clear(&ub, 1);
                if (c >= 0) (mode == 0 ? t_keep : t_none)[c] = t1 - t0;
            }
            sl_free(&t);
            ub_free(&ub);
        }
        printf("%8lld %10lld %15.1f us %9.1f us %19.2f us %19.1f us\n", (long long)ctxs[ci], (long long)n,
               bench_median(t_old, CALLS), bench_median(t_new, CALLS), bench_median(t_keep, CALLS),
               bench_median(t_none, CALLS));
        free(mm);
        free(u);
        free(sum);
        free(idx);
    }
    be_free(cpu);
    free(q);
    return 0;
}
