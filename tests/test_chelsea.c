/* Chelsea's soft matching (engine/policy/chelsea.c): the similarity search, which computes each
 * key's norm once and four pairs' sums side by side, gives the floats of the plain formula, one
 * pair at a time with its norms (checked through chelsea_head_similarity, which ranks heads by the
 * very links the merge keeps). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "common/quant.h"
#include "engine/kvcache.h"
#include "engine/policy/chelsea.h"
#include "tests/fwd_fixture.h"

static float plain_cosine(const float *x, const float *y, int64_t D)
{
    double d = 0, nx = 0, ny = 0;
    for (int64_t i = 0; i < D; i++) {
        d += (double)x[i] * y[i];
        nx += (double)x[i] * x[i];
        ny += (double)y[i] * y[i];
    }
    return nx > 0 && ny > 0 ? (float)(d / sqrt(nx * ny)) : 0.0f;
}

/* The mean over A tokens of the best B similarity in each chunk, as chelsea.h defines it. */
static double plain_similarity(const kv_cache *kv, int il, int g, int chunk)
{
    int64_t D = kv_head_dim(kv), T = kv_head_tokens(kv, il, g), j = 0;
    float *k = malloc(sizeof(float) * (size_t)(T * D));
    cr_assert(k);
    for (int i = 0; i < kv_n_pages(kv, il, g); i++) {
        const kv_page *p = kv_layer_page(kv, il, g, i);
        for (int32_t t = 0; t < p->n; t++, j++)
            for (int64_t d = 0; d < D; d++) k[j * D + d] = quant_fp16_to_f32(p->k[(size_t)t * (size_t)D + (size_t)d]);
    }
    double sum = 0;
    int64_t n = 0;
    for (int64_t c0 = 0; c0 < T; c0 += chunk) {
        int64_t c1 = c0 + chunk < T ? c0 + chunk : T;
        for (int64_t a = c0; a < c1; a += 2) {
            float bs = -2;
            for (int64_t b = c0 + 1; b < c1; b += 2) {
                float sim = plain_cosine(k + a * D, k + b * D, D);
                if (sim > bs) bs = sim;
            }
            if (bs > -2) {
                sum += bs;
                n++;
            }
        }
    }
    free(k);
    return n ? sum / (double)n : -1;
}

Test(chelsea, the_similarity_search_gives_the_plain_formulas_floats)
{
    char err[256];
    static const int dims[] = { 1, 3, 64, 129 };
    static const int chunks[] = { 2, 3, 7, 8, 9, 16, 17, 256 };
    uint64_t r = 4242;
    int compared = 0;
    for (int di = 0; di < 4; di++) {
        kv_cache *kv = kv_create(1, 2048, 2, dims[di], 16, NULL, err, sizeof err);
        cr_assert(kv, "%s", err);
        fwd_fixture_wide_keys(kv, 1, 300 + di * 7, &r);   /* sums that round: the order shows */
        for (int ci = 0; ci < 8; ci++)
            for (int g = 0; g < 2; g++) {
                double got = 0, want = plain_similarity(kv, 0, g, chunks[ci]);
                cr_assert(chelsea_head_similarity(kv, 0, g, chunks[ci], &got) == 0);
                cr_assert(got == want, "head dimension %d, chunks of %d, head %d: %.17g, the plain formula %.17g",
                          dims[di], chunks[ci], g, got, want);
                compared++;
            }
        kv_free(kv);
    }
    cr_assert_eq(compared, 64);
}
