/* page_fill.h - a device filling its copies of the cache's pages itself: a prompt's K/V rows from
 * the f32 rows in a bound buffer's device twin (be_ops.page_rows; the copies hold f16), and an
 * eviction's fresh pages from its copies of the pages they were packed from (be_ops.page_moves).
 * Each thread's work is a function C and CUDA share, so the host tests run it
 * (tests/test_page_copies.c), the rounding against the cache's own (be_host_f32_to_f16). */
#ifndef KVCHAT_PAGE_FILL_H
#define KVCHAT_PAGE_FILL_H

#include <stdint.h>

#include "kernels/quant_blocks.h"

/* x rounded to f16, to nearest even (no saturation: past 65504 it is an infinity, as the cache's
 * host rounding gives); a NaN stays a NaN (its payload may differ between the two). */
QB_HD uint16_t pf_half(float x)
{
#ifdef __CUDA_ARCH__
    return __half_as_ushort(__float2half_rn(x));
#else
    union {
        float f;
        uint32_t u;
    } in;
    in.f = x;
    uint32_t u = in.u & 0x7fffffffu, sign = (in.u >> 16) & 0x8000u, h;
    if (u >= 0x47800000u) {   /* 65536 or more, an infinity or a NaN */
        h = u > 0x7f800000u ? 0x7e00u | ((u >> 13) & 0x3ffu) : 0x7c00u;
    } else if (u < 0x38800000u) {   /* below the smallest normal half: adding 0.5 rounds it in place */
        union {
            uint32_t u;
            float f;
        } a, half;
        a.u = u;
        half.u = 0x3f000000u;
        a.f += half.f;
        h = a.u - 0x3f000000u;
    } else {   /* the exponent rebased, the mantissa rounded (a carry may reach the infinity) */
        h = (u + 0xc8000fffu + ((u >> 13) & 1u)) >> 13;
    }
    return (uint16_t)(h | sign);
#endif
}

/* One run of rows: row r (of rows) is dim floats at k + r * src_stride (and v ...), written as f16
 * at dk + r * dst_stride (and dv ...), its position pos0 + r at dpos[r]. */
typedef struct pf_job {
    const float *k, *v;
    uint16_t *dk, *dv;
    int32_t *dpos;
    int64_t src_stride;
    int32_t dst_stride, rows, dim, pos0;
} pf_job;

/* Thread tid of nt's share of job j: elements tid, tid + nt, ... of its rows, then its positions. */
QB_HD void pf_fill(const pf_job *j, int64_t tid, int64_t nt)
{
    const int64_t n = (int64_t)j->rows * j->dim;
    for (int64_t i = tid; i < n; i += nt) {
        const int64_t r = i / j->dim, d = i - r * j->dim;
        j->dk[r * j->dst_stride + d] = pf_half(j->k[r * j->src_stride + d]);
        j->dv[r * j->dst_stride + d] = pf_half(j->v[r * j->src_stride + d]);
    }
    for (int64_t r = tid; r < j->rows; r += nt) j->dpos[r] = j->pos0 + (int32_t)r;
}

/* One run of rows moved between two page copies (an eviction's packing, be_ops.page_moves): rows
 * elements of f16 keys and values (rows x stride: the copies' rows lie side by side) and their
 * positions, from k, v, pos to dk, dv, dpos. */
typedef struct pf_move_job {
    const uint16_t *k, *v;
    const int32_t *pos;
    uint16_t *dk, *dv;
    int32_t *dpos;
    int32_t rows, stride;
} pf_move_job;

/* Thread tid of nt's share of move j: elements tid, tid + nt, ... of its keys and values, then its
 * positions. */
QB_HD void pf_move(const pf_move_job *j, int64_t tid, int64_t nt)
{
    const int64_t n = (int64_t)j->rows * j->stride;
    for (int64_t i = tid; i < n; i += nt) {
        j->dk[i] = j->k[i];
        j->dv[i] = j->v[i];
    }
    for (int64_t r = tid; r < j->rows; r += nt) j->dpos[r] = j->pos[r];
}

#endif
