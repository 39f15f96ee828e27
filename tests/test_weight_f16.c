/* test_weight_f16.c - weights converted to f16 for a device (kernels/weight_f16.c): the parallel
 * conversion equals the reference dequantizer rounded element by element, for every weight type the
 * tiny models carry and for F32 values beyond f16's range (saturated, not infinite). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model.h"
#include "common/quant.h"
#include "kernels/cpu/threadpool.h"
#include "kernels/weight_f16.h"

#define TD "../shared/testdata/"

/* what a device must receive for element i of row r: the reference value, saturated, rounded */
static uint16_t expected(const be_weight *w, int64_t r, int64_t i, float *row)
{
    quant_dequant_row(w->type, (const char *)w->data + (size_t)r * w->row_bytes, row, w->n_in);
    float f = row[i];
    if (f > 65504.0f) f = 65504.0f;
    if (f < -65504.0f) f = -65504.0f;
    return quant_f32_to_fp16(f);
}

static void check_weight(tp_pool *pool, const be_weight *w, const char *what)
{
    /* an odd row range, so tasks end mid-way */
    int64_t r0 = w->n_out > 3 ? 1 : 0, r1 = w->n_out;
    size_t n = (size_t)((r1 - r0) * w->n_in);
    uint16_t *par = malloc(sizeof(uint16_t) * n), *ser = malloc(sizeof(uint16_t) * n);
    float *row = malloc(sizeof(float) * (size_t)w->n_in);
    cr_assert(par && ser && row);
    cr_assert(wf16_rows(pool, w, r0, r1, par) == 0);
    cr_assert(wf16_rows(NULL, w, r0, r1, ser) == 0);
    cr_expect(!memcmp(par, ser, sizeof(uint16_t) * n), "%s: threads changed the result", what);
    int bad = 0;
    for (int64_t r = r0; r < r1 && !bad; r += 7)
        for (int64_t i = 0; i < w->n_in; i += 3)
            if (ser[(size_t)((r - r0) * w->n_in + i)] != expected(w, r, i, row)) bad = 1;
    cr_expect(!bad, "%s: an element differs from the reference dequantizer rounded to f16", what);
    free(par);
    free(ser);
    free(row);
}

Test(weight_f16, every_tiny_model_weight_converts_like_the_reference)
{
    const char *files[] = { TD "tiny/tiny-gemma3-q4_k_m.gguf", TD "tiny/tiny-llama-q4_k_m.gguf",
                            TD "tiny/tiny-llama-f16.gguf" };
    char err[512];
    tp_pool *pool = tp_create(3, err, sizeof err);
    cr_assert(pool, "%s", err);
    for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
        model *m;
        cr_assert(model_load(&m, files[f], NULL, err, sizeof err) == 0, "%s", err);
        for (int il = 0; il < m->hp.n_layer; il++) {
            const model_layer *L = &m->layers[il];
            const be_weight *ws[] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down };
            for (size_t wi = 0; wi < 7; wi++) {
                char what[300];
                snprintf(what, sizeof what, "%s layer %d weight %zu (%s)", files[f], il, wi, quant_type_name(ws[wi]->type));
                check_weight(pool, ws[wi], what);
            }
        }
        check_weight(pool, &m->output, "output");
        model_free(m);
    }
    tp_free(pool);
}

Test(weight_f16, values_beyond_half_range_saturate)
{
    float v[64];
    for (int i = 0; i < 64; i++) v[i] = (i & 1 ? -1.0f : 1.0f) * (i < 32 ? 1e6f : (float)i * 0.25f);
    be_weight w = { v, GGML_TYPE_F32, 16, 4, 16 * sizeof(float) };
    uint16_t out[64];
    cr_assert(wf16_rows(NULL, &w, 0, 4, out) == 0);
    cr_expect_eq(out[0], 0x7bff, "1e6 became %#x, not the largest half", out[0]);
    cr_expect_eq(out[1], 0xfbff, "-1e6 became %#x, not the most negative half", out[1]);
    cr_expect_eq(out[40], quant_f32_to_fp16(10.0f));
}
