/* mass_bench.c - the eviction policies' attention mass (be_ops.attn_mass) at the 7B shape, a call
 * (one KV head of one layer) as each policy makes it:
 *   take     128 rows (32 probe rows x 4 query heads) against 1,536 and 2,560 tokens (the kept 1,024
 *            or 2,048 plus a chunk of 512), every global layer and KV head after every chunk;
 *   snapkv   128 rows (a window of 32 x 4) against 8,192 and 32,768 tokens, once a prompt;
 *   h2o      2,048 rows (a chunk of 512 x 4) against 8,192 tokens, every chunk.
 * Head dimension 128, random keys in pages of 32. Each line: milliseconds a call (the median of 5
 * after one), on 1 thread and on the given threads (default: every core), and what a whole 32K
 * prompt of TAKE costs at that rate (64 chunks x 32 layers x 8 KV heads calls).
 * Then the rest of TAKE's host work a call, on the cache itself (8 KV heads, 1,024 tokens kept,
 * chunks of 512 appended): the head's positions, the pooling (kernel 7), the top 1,024 and the
 * eviction (kv_keep_tokens), each the median over 8 chunks of the 8 heads' mean, and the sum over
 * a 32K prompt's calls; then the eviction as take.c makes it, spread over the given threads
 * (kv_keep_tokens_on).
 * Usage: mass_bench [threads] */
#include <stdio.h>
#include <stdlib.h>

#include "bench/bench_time.h"
#include "engine/kvcache.h"
#include "engine/policy/pol_util.h"
#include "kernels/backend.h"

enum { D = 128, P = 32, ROUNDS = 5 };

/* TAKE's host work a call besides the mass (take.c score_head and keep_top, with the mass replaced
 * by random positive values), and its eviction as take.c makes it, on the threads of `all`
 * (kv_keep_tokens_on), on a second cache given the same rows and choices: 0, or 1 when out of
 * memory. */
static int take_host_work(be_backend *all)
{
    enum { H = 8, CHUNK = 512, KEEP = 1024, CHUNKS = 9, PARTS = 5 };
    char err[256];
    kv_cache *kv = kv_create(1, (int64_t)CHUNKS * CHUNK + 64, H, D, P, NULL, err, sizeof err);
    kv_cache *kv2 = kv_create(1, (int64_t)CHUNKS * CHUNK + 64, H, D, P, NULL, err, sizeof err);
    float *k = malloc(sizeof(float) * (size_t)(CHUNK * H * D)), *v = malloc(sizeof(float) * (size_t)(CHUNK * H * D));
    float *mass = malloc(sizeof(float) * (KEEP + CHUNK)), *pooled = malloc(sizeof(float) * (KEEP + CHUNK));
    int32_t *pos = malloc(sizeof(int32_t) * (KEEP + CHUNK));
    int64_t *idx = malloc(sizeof(int64_t) * H * (KEEP + CHUNK));
    if (!kv || !kv2 || !k || !v || !mass || !pooled || !pos || !idx) return 1;
    pol_env env = { .kv = kv, .n_head_kv = H, .head_dim = D };
    double t[PARTS][CHUNKS - 1];
    for (int c = 0; c < CHUNKS; c++) {
        for (int64_t i = 0; i < (int64_t)CHUNK * H * D; i++) k[i] = v[i] = bench_frand();
        if (kv_append(kv, 0, k, v, CHUNK, (int64_t)c * CHUNK) || kv_append(kv2, 0, k, v, CHUNK, (int64_t)c * CHUNK))
            return 1;
        kv_commit(kv, (int64_t)(c + 1) * CHUNK);
        kv_commit(kv2, (int64_t)(c + 1) * CHUNK);
        double sum[PARTS] = { 0 };
        const int64_t *keeps[H];
        int64_t nks[H];
        for (int g = 0; g < H; g++) {
            int64_t *ig = idx + (int64_t)g * (KEEP + CHUNK);
            double t0 = bench_now_us();
            int64_t T = pol_head_positions(&env, 0, g, NULL);
            pol_head_positions(&env, 0, g, pos);
            double t1 = bench_now_us();
            for (int64_t j = 0; j < T; j++) mass[j] = bench_frand() + 0.5f;
            double t2 = bench_now_us();
            pol_pool(mass, T, 7, 1, pooled);
            double t3 = bench_now_us();
            int64_t nk = pol_top_k64(pooled, T, KEEP, ig);
            double t4 = bench_now_us();
            if (nk < T && kv_keep_tokens(kv, 0, g, ig, nk)) return 1;
            double t5 = bench_now_us();
            keeps[g] = nk < T ? ig : NULL;
            nks[g] = nk;
            sum[0] += t1 - t0;
            sum[1] += t3 - t2;
            sum[2] += t4 - t3;
            sum[3] += t5 - t4;
        }
        double t6 = bench_now_us();
        for (int g = 0; g < H; g++)
            if (keeps[g] && kv_keep_tokens_on(kv2, all, 0, g, keeps[g], nks[g])) return 1;
        sum[4] = bench_now_us() - t6;
        for (int i = 0; c > 0 && i < PARTS; i++) t[i][c - 1] = sum[i] / H / 1e3;
    }
    char spread[64];
    snprintf(spread, sizeof spread, "eviction on %d threads", all->n_threads);
    const char *const names[PARTS] = { "positions", "pooling", "top 1,024", "eviction", spread };
    printf("\nTAKE's host work a call besides the mass (8 KV heads, 1,024 kept + chunks of 512; 1 thread,\n"
           "and the eviction as take.c makes it, on the threads given)\n");
    printf("%-44s %12s %26s\n", "part", "ms a call", "TAKE's 32K prompt (s)");
    double total = 0;
    for (int i = 0; i < PARTS; i++) {
        double ms = bench_median(t[i], CHUNKS - 1);
        if (i < PARTS - 1) total += ms;
        printf("%-44s %12.4f %26.2f\n", names[i], ms, ms * 64 * 32 * 8 / 1e3);
        if (i == PARTS - 2) printf("%-44s %12.4f %26.2f\n", "all, 1 thread", total, total * 64 * 32 * 8 / 1e3);
    }
    kv_free(kv);
    kv_free(kv2);
    free(k);
    free(v);
    free(mass);
    free(pooled);
    free(pos);
    free(idx);
    return 0;
}

static double time_call(be_backend *b, const be_mass *m)
{
    double t[ROUNDS];
    for (int r = -1; r < ROUNDS; r++) {
        double t0 = bench_now_us();
        b->ops->attn_mass(b, m);
        if (r >= 0) t[r] = (bench_now_us() - t0) / 1e3;
    }
    return bench_median(t, ROUNDS);
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    char err[256];
    be_backend *one = be_cpu_create(1, err, sizeof err), *all = one ? be_cpu_create(threads, err, sizeof err) : NULL;
    if (!one || !all) {
        fprintf(stderr, "mass_bench: %s\n", err);
        return 1;
    }
    static const struct {
        const char *what;
        int64_t rows, tokens;
    } cases[] = { { "take", 128, 1536 }, { "take", 128, 2560 }, { "snapkv", 128, 8192 },
                  { "snapkv", 128, 32768 }, { "h2o", 2048, 8192 } };
    printf("attention mass a call (one KV head of a layer), head dimension %d, 1 thread and %d\n", D, all->n_threads);
    printf("%-8s %6s %8s %12s %12s %26s\n", "policy", "rows", "tokens", "ms, 1", "ms, all", "TAKE's 32K prompt, all (s)");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t T = cases[c].tokens, rows = cases[c].rows, np = (T + P - 1) / P;
        uint16_t *k = malloc(sizeof(uint16_t) * (size_t)(T * D));
        int32_t *pos = malloc(sizeof(int32_t) * (size_t)T);
        float *q = malloc(sizeof(float) * (size_t)(rows * D)), *acc = calloc((size_t)T, sizeof(float));
        int64_t work_rows = rows < 64 ? rows : 64;
        float *work = malloc(sizeof(float) * (size_t)(work_rows * T));
        be_kv_page *pages = calloc((size_t)np, sizeof *pages);
        if (!k || !pos || !q || !acc || !work || !pages) {
            fprintf(stderr, "mass_bench: out of memory\n");
            return 1;
        }
        for (int64_t i = 0; i < T * D; i++) {
            float x = bench_frand();
            be_host_f32_to_f16(1, &x, &k[i]);
        }
        for (int64_t i = 0; i < T; i++) pos[i] = (int32_t)i;
        for (int64_t i = 0; i < rows * D; i++) q[i] = bench_frand() * 0.1f;
        for (int64_t i = 0; i < np; i++)
            pages[i] = (be_kv_page){ .k = k + i * P * D, .pos = pos + i * P,
                                     .n = (int32_t)(T - i * P < P ? T - i * P : P), .stride = D };
        /* rows of 4 query heads a position, every position after the tokens: all of them seen */
        be_mass m = { q, rows / 4, 4 * D, T, 0, 4, D, pages, np, acc, work, work_rows * T, 0, 0, NULL };
        double t1 = time_call(one, &m), ta = time_call(all, &m);
        printf("%-8s %6lld %8lld %12.3f %12.3f", cases[c].what, (long long)rows, (long long)T, t1, ta);
        if (cases[c].what[0] == 't') printf(" %26.1f", ta * 64 * 32 * 8 / 1e3);
        printf("\n");
        fflush(stdout);
        free(k);
        free(pos);
        free(q);
        free(acc);
        free(work);
        free(pages);
    }
    be_free(one);
    if (take_host_work(all)) {
        fprintf(stderr, "mass_bench: out of memory\n");
        return 1;
    }
    be_free(all);
    return 0;
}
