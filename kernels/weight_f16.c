/* weight_f16.c - weight rows dequantized and rounded to f16 in parallel (weight_f16.h). */
#include "kernels/weight_f16.h"

#include <stdlib.h>

#include "common/quant.h"

#define ROWS_PER_TASK 16

typedef struct wf16_job {
    const be_weight *w;
    int64_t r0, r1;
    uint16_t *out;
    float *row;          /* [threads][n_in] */
} wf16_job;

static void convert_rows(const be_weight *w, int64_t r0, int64_t r1, int64_t first, float *row, uint16_t *out)
{
    for (int64_t r = r0; r < r1; r++) {
        quant_dequant_row(w->type, (const char *)w->data + (size_t)r * w->row_bytes, row, w->n_in);
        uint16_t *o = out + (r - first) * w->n_in;
        for (int64_t i = 0; i < w->n_in; i++) {
            float f = row[i];
            if (f > 65504.0f) f = 65504.0f;
            if (f < -65504.0f) f = -65504.0f;
            o[i] = quant_f32_to_fp16(f);
        }
    }
}

static void wf16_task(void *ctx, int64_t task, int thread)
{
    wf16_job *j = ctx;
    int64_t a = j->r0 + task * ROWS_PER_TASK, b = a + ROWS_PER_TASK < j->r1 ? a + ROWS_PER_TASK : j->r1;
    convert_rows(j->w, a, b, j->r0, j->row + (size_t)thread * (size_t)j->w->n_in, j->out);
}

int wf16_rows(tp_pool *pool, const be_weight *w, int64_t r0, int64_t r1, uint16_t *out)
{
    int threads = pool ? tp_n_threads(pool) : 1;
    float *row = malloc(sizeof(float) * (size_t)w->n_in * (size_t)threads);
    if (!row) return -1;
    if (!pool) {
        convert_rows(w, r0, r1, r0, row, out);
    } else {
        wf16_job j = { w, r0, r1, out, row };
        tp_run(pool, wf16_task, &j, (r1 - r0 + ROWS_PER_TASK - 1) / ROWS_PER_TASK);
    }
    free(row);
    return 0;
}
