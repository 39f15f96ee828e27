/* chess_bench.c - the host's share of CHESS's reconstruction at each decode step (engine/policy/chess.c),
 * or of another selection's choice.
 *
 * At the 7B shape (32 global layers, 8 KV heads, head dimension 128, pages of 32) over 2K, 8K and
 * 32K tokens of random keys, the aggressive preset rebuilding every step (its default), or the
 * policy given: each step appends one token to every layer, begins the step (the reconstruction)
 * and asks every layer for its selection, on the CPU backend with the given threads (default 1).
 * Each line: milliseconds of the first step (every summary computed), milliseconds a step after it
 * (the median of 32 steps after 4 warm-up steps), of those the milliseconds inside the backend's
 * ops (key_means, scores, bound_pages: what a device backend would run) and outside them (the
 * policy's own host work, which a device backend leaves on the host), and the pages the first
 * layer selected at the last step (the same before and after a change that only makes it faster).
 * Usage: chess_bench [threads] [max_ctx] [policy] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_time.h"
#include "engine/kvcache.h"
#include "engine/policy/policy.h"
#include "kernels/backend.h"
#include "kernels/op_profile.h"

enum { L = 32, H = 8, D = 128, P = 32, WARM = 4, STEPS = 32 };

/* n tokens at p0 into every layer, random keys and values (a chunk at a time). */
static int fill(kv_cache *kv, int64_t p0, int64_t n, float *k, float *v, int64_t chunk)
{
    for (int64_t c = 0; c < n; c += chunk) {
        int64_t cn = n - c < chunk ? n - c : chunk;
        for (int il = 0; il < L; il++) {
            for (int64_t i = 0; i < cn * H * D; i++) {
                k[i] = bench_frand();
                v[i] = bench_frand();
            }
            if (kv_append(kv, il, k, v, cn, p0 + c) != 0) return -1;
        }
        kv_commit(kv, p0 + c + cn);
    }
    return 0;
}

/* Seconds inside the ops a selection calls, so far. */
static double op_seconds(be_backend *b)
{
    static const char *const rows[] = { "key_means", "scores", "bound_pages" };
    double total = 0;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        double s = 0;
        op_profile_calls(b, rows[i], &s);
        total += s;
    }
    return total;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    int64_t max_ctx = argc > 2 ? atoll(argv[2]) : 32768;
    const char *policy = argc > 3 ? argv[3] : "chess:preset=aggressive";
    char err[512];
    be_backend *cpu = be_cpu_create(threads, err, sizeof err), *b = cpu ? op_profile_wrap(cpu, OP_PROFILE_HOST, NULL) : NULL;
    if (!b) {
        fprintf(stderr, "chess_bench: %s\n", cpu ? "out of memory" : err);
        if (cpu) be_free(cpu);
        return 1;
    }
    int global[L];
    for (int i = 0; i < L; i++) global[i] = i;
    const int64_t chunk = 256;
    float *k = malloc(sizeof(float) * chunk * H * D), *v = malloc(sizeof(float) * chunk * H * D);
    float *q = calloc((size_t)H * 4 * D, sizeof(float));
    if (!k || !v || !q) {
        fprintf(stderr, "chess_bench: out of memory\n");
        return 1;
    }
    printf("%s: %d global layers x %d KV heads, head dimension %d, pages of %d, %d thread(s)\n", policy, L, H, D, P,
           threads);
    printf("%8s %12s %12s %12s %12s  %s\n", "context", "first ms", "ms a step", "in ops", "outside",
           "first layer's pages at the last step");
    const int64_t ctxs[] = { 2048, 8192, 32768 };
    for (size_t ci = 0; ci < sizeof ctxs / sizeof ctxs[0] && ctxs[ci] <= max_ctx; ci++) {
        int64_t ctx = ctxs[ci];
        kv_cache *kv = kv_create(L, ctx + WARM + STEPS + 1, H, D, P, NULL, err, sizeof err);
        if (!kv || fill(kv, 0, ctx, k, v, chunk) != 0) {
            fprintf(stderr, "chess_bench: the cache at %lld tokens: %s\n", (long long)ctx, kv ? "out of memory" : err);
            return 1;
        }
        static const float no_boundary[1] = { 0 };   /* token 0 ends no sentence: SentKV cuts at the ideal end */
        pol_env env = { kv, b, H * 4, H, D, global, L, no_boundary, 1, NULL, NULL, NULL, NULL, 0, NULL, NULL };
        pol_spec spec;
        if (pol_parse(&spec, policy, NULL, err, sizeof err) != 0) {
            fprintf(stderr, "chess_bench: %s\n", err);
            return 1;
        }
        pol_set *ps = pol_set_create(&spec, &env, err, sizeof err);
        if (!ps) {
            fprintf(stderr, "chess_bench: %s\n", err);
            return 1;
        }
        double t[STEPS], t_ops[STEPS], t_host[STEPS], first_ms = 0;
        char pages[4096] = "";
        for (int s = 0; s < WARM + STEPS; s++) {
            int64_t pos = kv_len(kv);
            if (fill(kv, pos, 1, k, v, 1) != 0) return 1;
            int32_t tok = 0;
            double t0 = bench_now_us(), o0 = op_seconds(b);
            pol_set_begin(ps, &tok, 1, pos, 1);
            const pol_sel *first = NULL;
            for (int il = 0; il < L; il++) {
                const pol_sel *sel = pol_set_select(ps, il, q);
                if (il == 0) first = sel;
            }
            double t1 = bench_now_us(), ops_ms = (op_seconds(b) - o0) * 1e3;
            if (s == 0) first_ms = (t1 - t0) / 1e3;
            if (s >= WARM) {
                t[s - WARM] = (t1 - t0) / 1e3;
                t_ops[s - WARM] = ops_ms;
                t_host[s - WARM] = (t1 - t0) / 1e3 - ops_ms;
            }
            if (s == WARM + STEPS - 1 && first) {
                first = pol_set_select(ps, 0, q);
                size_t o = 0;
                for (int64_t i = 0; i < first->n && o + 16 < sizeof pages; i++)
                    o += (size_t)snprintf(pages + o, sizeof pages - o, "%s%d", i ? " " : "", first->idx[i]);
            }
        }
        printf("%8lld %12.3f %12.3f %12.3f %12.3f  %s\n", (long long)ctx, first_ms, bench_median(t, STEPS),
               bench_median(t_ops, STEPS), bench_median(t_host, STEPS), pages);
        fflush(stdout);
        pol_set_free(ps);
        kv_free(kv);
    }
    free(k);
    free(v);
    free(q);
    be_free(b);
    return 0;
}
