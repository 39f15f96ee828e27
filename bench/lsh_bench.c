/* lsh_bench.c - LASER-KV's SimHash recall (be_ops.lsh_hits) a call at the 7B shape, as laser.c makes
 * it when a block is complete: one layer's 8 KV heads of 5,120 tokens each (a block of 4,096 and
 * 1,024 kept before it, so the codes are of the block's 4,096), 32 probe rows of 4 query heads,
 * 8 rounds of 8 bits (the defaults), head dimension 128, pages of 32.
 * Each line: milliseconds a call (the median of 5 after one), and what a 32K prompt's 8 blocks of
 * 32 layers cost at that rate: the plain loops laser.c ran before the op (a dot a plane, every
 * query code compared with a key's; 1 thread, the median of 3), then the op on 1 thread and on the
 * given threads (default: every core). Both give the same hits (checked here too).
 * Usage: lsh_bench [threads] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_time.h"
#include "common/quant.h"
#include "kernels/backend.h"

enum { D = 128, P = 32, H = 8, G = 4, NQ = 32, ROUNDS = 8, BITS = 8, KEPT = 1024, BLOCK = 4096, T = KEPT + BLOCK };

static uint32_t plain_code(const float *pt, int r, const float *v)
{
    uint32_t code = 0;
    for (int b = 0; b < BITS; b++) {
        float d = 0;
        for (int i = 0; i < D; i++) d += pt[i * ROUNDS * BITS + r * BITS + b] * v[i];
        code |= (uint32_t)(d >= 0) << b;
    }
    return code;
}

/* What laser.c's score_layer computed before the op, every head of the layer. */
static void plain_hits(const be_lsh *l, int32_t *hits)
{
    uint32_t *qcode = malloc(sizeof(uint32_t) * ROUNDS * NQ * G);
    float kf[D];
    if (!qcode) abort();
    int64_t j = 0;
    for (int h = 0; h < H; h++) {
        for (int r = 0; r < ROUNDS; r++)
            for (int t = 0; t < NQ; t++)
                for (int hh = 0; hh < G; hh++)
                    qcode[(r * NQ + t) * G + hh] = plain_code(l->planes_t, r, l->q + t * l->q_stride + (h * G + hh) * D);
        for (int64_t i = l->head_pages[h]; i < l->head_pages[h + 1]; i++) {
            const be_kv_page *p = &l->pages[i];
            for (int32_t t = 0; t < p->n; t++, j++) {
                hits[j] = 0;
                if (p->pos[t] < l->pos_min) continue;
                for (int d = 0; d < D; d++) kf[d] = quant_fp16_to_f32(p->k[(size_t)t * D + (size_t)d]);
                for (int r = 0; r < ROUNDS; r++) {
                    uint32_t kc = plain_code(l->planes_t, r, kf);
                    for (int k = 0; k < NQ * G; k++) hits[j] += qcode[r * NQ * G + k] == kc;
                }
            }
        }
    }
    free(qcode);
}

static double time_op(be_backend *b, const be_lsh *l, int reps)
{
    double t[5];
    be_lsh_hits(b, l);
    for (int i = 0; i < reps; i++) {
        double t0 = bench_now_us();
        be_lsh_hits(b, l);
        t[i] = (bench_now_us() - t0) / 1e3;
    }
    return bench_median(t, reps);
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    char err[256];
    be_backend *one = be_cpu_create(1, err, sizeof err), *all = be_cpu_create(threads, err, sizeof err);
    if (!one || !all) {
        fprintf(stderr, "lsh_bench: %s\n", err);
        return 1;
    }
    const int64_t np_head = (T + P - 1) / P;
    uint16_t *k = malloc(sizeof(uint16_t) * (size_t)H * T * D);
    int32_t *pos = malloc(sizeof(int32_t) * T), *hits = malloc(sizeof(int32_t) * (size_t)H * T),
            *want = malloc(sizeof(int32_t) * (size_t)H * T);
    float *q = malloc(sizeof(float) * NQ * H * G * D), *pt = malloc(sizeof(float) * ROUNDS * BITS * D);
    uint32_t *codes = malloc(sizeof(uint32_t) * H * ROUNDS * NQ * G);
    be_kv_page *pages = calloc((size_t)(H * np_head), sizeof *pages);
    if (!k || !pos || !hits || !want || !q || !pt || !codes || !pages) {
        fprintf(stderr, "lsh_bench: out of memory\n");
        return 1;
    }
    for (int64_t i = 0; i < (int64_t)H * T * D; i++) {
        float x = bench_frand();
        be_host_f32_to_f16(1, &x, &k[i]);
    }
    for (int64_t i = 0; i < T; i++) pos[i] = (int32_t)(i < KEPT ? i * 4 : KEPT * 4 + (i - KEPT));
    for (int i = 0; i < NQ * H * G * D; i++) q[i] = bench_frand();
    for (int i = 0; i < ROUNDS * BITS * D; i++) pt[i] = bench_frand();
    int64_t hp[H + 1];
    for (int h = 0; h <= H; h++) hp[h] = h * np_head;
    for (int h = 0; h < H; h++)
        for (int64_t i = 0; i < np_head; i++)
            pages[h * np_head + i] = (be_kv_page){ .k = k + ((int64_t)h * T + i * P) * D, .pos = pos + i * P,
                                                   .n = (int32_t)(T - i * P < P ? T - i * P : P), .stride = D };
    be_lsh l = { q, NQ, (int64_t)H * G * D, 0, G, D, pt, ROUNDS, BITS, pages, H * np_head, H, hp,
                 pos[KEPT], codes, hits, 0 };
    double tp[3];
    for (int i = 0; i < 3; i++) {
        double t0 = bench_now_us();
        plain_hits(&l, want);
        tp[i] = (bench_now_us() - t0) / 1e3;
    }
    double t_plain = bench_median(tp, 3), t1 = time_op(one, &l, 5), ta = time_op(all, &l, 5);
    if (memcmp(hits, want, sizeof(int32_t) * (size_t)H * T)) {
        fprintf(stderr, "lsh_bench: the op's hits differ from the plain loops'\n");
        return 1;
    }
    printf("SimHash recall a call (a layer's %d KV heads, %d tokens each, %d coded), head dimension %d, %d probe rows "
           "x %d, %d rounds of %d bits\n", H, T, BLOCK, D, NQ, G, ROUNDS, BITS);
    printf("%-28s %12s %26s\n", "", "ms a call", "a 32K prompt (s)");
    printf("%-28s %12.2f %26.2f\n", "plain loops, 1 thread", t_plain, t_plain * 32 * 8 / 1e3);
    printf("%-28s %12.2f %26.2f\n", "op, 1 thread", t1, t1 * 32 * 8 / 1e3);
    char what[64];
    snprintf(what, sizeof what, "op, %d threads", all->n_threads);
    printf("%-28s %12.2f %26.2f\n", what, ta, ta * 32 * 8 / 1e3);
    be_free(one);
    be_free(all);
    free(k);
    free(pos);
    free(hits);
    free(want);
    free(q);
    free(pt);
    free(codes);
    free(pages);
    return 0;
}
