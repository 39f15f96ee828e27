/* pick_bench.c - the host's share of choosing a token, before and after the backend's pick.
 *
 * A decode step ends with a token chosen from a row of logits: 262144 of them for the default
 * model. Before the pick (kernels/backend.h, be_pick) the row came back to the host whole and the
 * sampler read it (samp_entropy when the uncertainty monitor is on, samp_sample); now the backend
 * gives the k best candidates and the entropy, and the sampler draws from those
 * (samp_sample_top). This times both on this machine's CPU for the settings an answer runs with:
 *   greedy             temperature 0 (bench's decode steps, --temp 0);
 *   default            temperature 0.8, top-k 40, top-p 0.95, min-p 0.05;
 *   default + monitor  the same with the entropy (chat with CHESS, --show-events);
 *   min-p only         top-k off: up to 256 candidates, the row read again when they do not settle
 *                      the draw;
 * each with a repetition penalty of 1.1 over the last 64 tokens. "row" is the old path's host work,
 * "pick" the CPU backend's pick plus the draw: on a GPU the pick runs on the device and the host
 * keeps only the draw (and the row's 1 MiB no longer comes back). Each line: microseconds a token,
 * the median of 200 draws over rows like a model's (a few large logits over a long tail), both
 * drawing the same tokens (checked).
 * Usage: pick_bench [N_VOCAB]   (default 262144) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_time.h"
#include "engine/sampler.h"
#include "kernels/backend.h"

enum { DRAWS = 200 };

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0));
}

int main(int argc, char **argv)
{
    int32_t nv = argc > 1 ? atoi(argv[1]) : 262144;
    if (nv < 2 || nv > (1 << 26)) {
        fprintf(stderr, "usage: pick_bench [N_VOCAB] (2 to 67108864)\n");
        return 1;
    }
    char err[256];
    be_backend *cpu = be_cpu_create(1, err, sizeof err);
    if (!cpu) {
        fprintf(stderr, "pick_bench: %s\n", err);
        return 1;
    }
    float *row = malloc(sizeof(float) * (size_t)nv), *work = malloc(sizeof(float) * (size_t)nv);
    if (!row || !work) return 1;
    static const struct {
        const char *name;
        float temp;
        int32_t top_k;
        float min_p;
        int monitor;
    } set[] = { { "greedy", 0, 40, 0.05f, 0 },
                { "default", 0.8f, 40, 0.05f, 0 },
                { "default + monitor", 0.8f, 40, 0.05f, 1 },
                { "min-p only", 0.8f, 0, 0.05f, 0 } };
    printf("%d logits, one thread; microseconds a token (median of %d)\n", nv, DRAWS);
    printf("%-20s %10s %10s %12s\n", "setting", "row", "pick", "row again");
    for (size_t si = 0; si < sizeof set / sizeof *set; si++) {
        samp_params sp = samp_params_default();
        sp.temperature = set[si].temp;
        sp.top_k = set[si].top_k;
        sp.min_p = set[si].min_p;
        sp.repeat_penalty = 1.1f;
        samp *a = samp_create(&sp, nv), *b = samp_create(&sp, nv);
        double t_row[DRAWS], t_pick[DRAWS];
        int again = 0;
        for (int d = 0; d < DRAWS; d++) {
            for (int32_t i = 0; i < nv; i++) row[i] = 4.0f * frand() - 6.0f;   /* the tail */
            for (int i = 0; i < 12; i++) row[(int32_t)(frand() * (float)nv)] = 6.0f + 4.0f * frand();
            double t0 = bench_now_us(), h, vh;
            memcpy(work, row, sizeof(float) * (size_t)nv);   /* the row as it arrives */
            if (set[si].monitor) samp_entropy(work, nv, sp.temperature, &h, &vh);
            int32_t want = samp_sample(a, work);
            double t1 = bench_now_us();
            int32_t pen[4096], k;
            float penalty, val[BE_PICK_MAX];
            int32_t id[BE_PICK_MAX];
            int32_t n_pen = samp_pick_request(b, BE_PICK_MAX, pen, &penalty, &k);
            be_pick p = { row, nv, 0, pen, n_pen, penalty, k, set[si].monitor, sp.temperature, val, id, 0, 0, 0 };
            cpu->ops->pick(cpu, &p, 1);
            int32_t got = samp_sample_top(b, val, id, p.n_out, k);
            if (got < 0) {
                memcpy(work, row, sizeof(float) * (size_t)nv);
                got = samp_sample(b, work);
                again++;
            }
            double t2 = bench_now_us();
            if (got != want) {
                fprintf(stderr, "pick_bench: %s draw %d: %d from the candidates, %d from the row\n", set[si].name, d,
                        got, want);
                return 1;
            }
            samp_accept(a, want);
            samp_accept(b, got);
            t_row[d] = t1 - t0;
            t_pick[d] = t2 - t1;
        }
        printf("%-20s %10.1f %10.1f %9d/%d\n", set[si].name, bench_median(t_row, DRAWS), bench_median(t_pick, DRAWS),
               again, DRAWS);
        samp_free(a);
        samp_free(b);
    }
    free(row);
    free(work);
    be_free(cpu);
    return 0;
}
