/* decode_dot.h - the decode products' per-lane work, in one header for C and CUDA (issue 25, stage 1).
 *
 * A decode product (1 to QB_MAX_TOK tokens) is bound by the bytes of its weight, so each warp reads
 * its row once, straight from global memory, and spends few instructions a value:
 * - Quantized rows (Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K) are multiplied in integers: the activations
 *   are first rounded to 8-bit codes in blocks of 32 with one f32 scale each (dd_scale, dd_code;
 *   once per product for all its tokens and every weight sharing the input), then a lane takes 16
 *   values of the row at a time (an "item": two groups of 8 values, each inside one 32-value
 *   sub-block with one weight scale), unpacks them into four words of signed 8-bit codes and
 *   multiplies them by the activations' codes four at a time (dd_dp4a, the device's dp4a).
 * - Q4_K and Q5_K rows go the wide path by default (dd_lane_dot_w, below): 32 values a lane at a time
 *   in 16-byte loads, the minimums' terms from the activations' block sums (KVCHAT_CUDA_MMV=narrow:
 *   the items above, to compare).
 * - A warp may take up to DD_MAX_ROWS rows, loading each token's activations once for all of them.
 * - F16/BF16 rows are read 16 bytes (8 values) at a time and multiplied by the f32 activations.
 * The kernel in kernels/cuda/vec_dot.cu runs dd_lane_dot (dd_lane_dot_q / _w / _h by type) on every
 * lane of a warp (one or two rows a warp) and adds the lanes by a butterfly of shuffles;
 * tests/test_quant_blocks.c runs the same functions for all 32 lanes on the host and checks the
 * result against double-precision products. Every float operation is written out (QB_MUL, QB_ADD,
 * fmaf), so the device, which never fuses these, gives the host's bits.
 *
 * Rounding the activations to 8 bits is what the CPU backend does too (kernels/cpu/vec_dot.c, with
 * an f16 scale per 32 for Q4_0/Q5_0/Q8_0 and one f32 scale per 256 for the K-quants) and what the
 * reference implementation's GPU kernels do; here every type gets an f32 scale per 32 values, the
 * finer of the two: the error of a product is at most sum |w_i| * d_b / 2 over its blocks b. */
#ifndef KVCHAT_DECODE_DOT_H
#define KVCHAT_DECODE_DOT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/quant_blocks.h"

#define DD_QBLOCK 32   /* activations sharing one scale */
#define DD_ITEM 16     /* values of a quantized row a lane takes at a time */
#define DD_HITEM 8     /* values of an F16/BF16 row a lane takes at a time (16 bytes) */

/* 1 for the types multiplied in integers. */
QB_HD int dd_integer_type(uint32_t type) { return qb_native(type) && type != GGML_TYPE_F16 && type != GGML_TYPE_BF16; }

/* c plus the products of a's and b's four signed bytes. */
QB_HD int dd_dp4a(int a, int b, int c)
{
#ifdef __CUDA_ARCH__
    return __dp4a(a, b, c);
#else
    for (int k = 0; k < 4; k++)
        c += (int)(int8_t)(uint8_t)((uint32_t)a >> (8 * k)) * (int)(int8_t)(uint8_t)((uint32_t)b >> (8 * k));
    return c;
#endif
}

/* The larger of two magnitudes, NaN if either is (a NaN activation must not turn into a plausible
 * product). */
QB_HD float dd_amax2(float a, float b) { return a > b || a != a ? a : b; }

/* The scale of a block of activations whose largest magnitude is amax (the CPU's formula). */
QB_HD float dd_scale(float amax) { return QB_DIV(amax, 127.0f); }

/* The 8-bit code of activation x in a block of scale d: x / d to the nearest, ties to even, within
 * +-127 (a NaN gives 0; its block's scale is NaN already). A quotient, not x times 1 / d as the CPU
 * computes it: 1 / d overflows for a subnormal d (a block of activations all below 3.7e-37), which
 * would code every value as +-127. */
QB_HD int8_t dd_code(float x, float d)
{
    const float v = d != 0.0f ? rintf(QB_DIV(x, d)) : 0.0f;
    return (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : v == v ? (int)v : 0);
}

/* A block's scale times the sum of its codes (an integer, exact in a float): what the K-quants'
 * minimums multiply, once per block rather than once per weight row (dd_wide_dot). */
QB_HD float dd_block_sum(float d, int code_sum) { return QB_MUL(d, (float)code_sum); }

/* The host's rounding of n activations (a multiple of 32): codes q[n], scales d[n / 32] and, when s
 * is not NULL, each block's dd_block_sum s[n / 32]. The device does the same with a warp per block
 * (its largest magnitude and its codes' sum by shuffles). */
static inline void dd_quantize(const float *x, int64_t n, int8_t *q, float *d, float *s)
{
    for (int64_t b = 0; b < n / DD_QBLOCK; b++) {
        float amax = 0.0f;
        for (int j = 0; j < DD_QBLOCK; j++) amax = dd_amax2(amax, fabsf(x[b * DD_QBLOCK + j]));
        d[b] = dd_scale(amax);
        int sum = 0;
        for (int j = 0; j < DD_QBLOCK; j++) sum += q[b * DD_QBLOCK + j] = dd_code(x[b * DD_QBLOCK + j], d[b]);
        if (s) s[b] = dd_block_sum(d[b], sum);
    }
}

/* Loads of 2, 4 and 8 bytes: from a 2-byte aligned address (Q4_0, Q5_0, Q8_0 and Q6_K blocks are 18,
 * 22, 34 and 210 bytes long), from a 4- and an 8-byte aligned one. */
QB_HD uint32_t dd_ld_u16(const uint8_t *p)
{
#ifdef __CUDA_ARCH__
    return *(const uint16_t *)p;
#else
    return qb_u16(p);
#endif
}

QB_HD int dd_ld_a4(const uint8_t *p)
{
#ifdef __CUDA_ARCH__
    return *(const int *)p;
#else
    int v;
    memcpy(&v, p, 4);
    return v;
#endif
}

QB_HD void dd_ld_a8(const void *p, int *a, int *b)
{
#ifdef __CUDA_ARCH__
    const int2 v = *(const int2 *)p;
    *a = v.x;
    *b = v.y;
#else
    memcpy(a, p, 4);
    memcpy(b, (const uint8_t *)p + 4, 4);
#endif
}

/* The word of two halves loaded apart (from a 2-byte aligned address). */
QB_HD int dd_join(uint32_t lo, uint32_t hi) { return (int)(lo | (hi << 16)); }

/* Four bytes of codes 0..2^k-1 minus 2^(k-1), each byte on its own (no borrow crosses a byte: each
 * is raised by 128 first), as signed bytes. */
QB_HD int dd_centre(int v, uint32_t half)
{
    return (int)((((uint32_t)v | 0x80808080u) - half * 0x01010101u) ^ 0x80808080u);
}

/* Four bits (bit i of b) moved to bit 4 of byte i. */
QB_HD int dd_bits_to_byte4(uint32_t b)
{
    return (int)(((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25));
}

/* 16 values of a quantized row, unpacked: v[0], v[1] are group 0's 8 signed codes, v[2], v[3] group
 * 1's; group g starts at value pos[g] of the row (a multiple of 8, inside one block of 32
 * activations); its values are s[g] * code - m[g] (m: Q4_K and Q5_K only). */
typedef struct {
    int v[4];
    int pos[2];
    float s[2], m[2];
} dd_item;

/* An item's bytes as loaded (dd_fetch), not yet used: each 2-byte aligned word as its two halves.
 * A lane asks for every item it keeps in flight before it unpacks any (dd_unpack): the device
 * issues a warp's instructions in order, so an unpacking placed after an item's loads held the
 * next item's loads back until the first item's bytes came (on the H200 two items in flight were
 * no faster than one: docs/gpu.md, stage 1's third part). */
typedef struct {
    uint32_t w[11];
} dd_raw;

/* Item i of a row (values [16 i, 16 i + 16) in the blocks' own order: see each case of dd_unpack):
 * its loads only. */
QB_HD void dd_fetch(uint32_t type, const uint8_t *row, int i, dd_raw *r)
{
    switch (type) {
    case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: {
        const int five = type == GGML_TYPE_Q5_0, k = i & 1;
        const uint8_t *b = row + (size_t)(i >> 1) * (five ? 22 : 18);
        const uint8_t *qs = b + (five ? 6 : 2) + 8 * k;
        QB_UNROLL
        for (int j = 0; j < 4; j++) r->w[j] = dd_ld_u16(qs + 2 * j);
        if (five) {
            r->w[4] = dd_ld_u16(b + 2);
            r->w[5] = dd_ld_u16(b + 4);
        }
        r->w[6] = dd_ld_u16(b);
        break;
    }
    case GGML_TYPE_Q8_0: {
        const uint8_t *b = row + (size_t)(i >> 1) * 34, *qs = b + 2 + 16 * (i & 1);
        QB_UNROLL
        for (int j = 0; j < 8; j++) r->w[j] = dd_ld_u16(qs + 2 * j);
        r->w[8] = dd_ld_u16(b);
        break;
    }
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: {
        const int five = type == GGML_TYPE_Q5_K, k = i & 15, p = k >> 2, l0 = 8 * (k & 3);
        const uint8_t *b = row + (size_t)(i >> 4) * (five ? 176 : 144);
        int a0, a1;
        dd_ld_a8(b + (five ? 48 : 16) + 32 * p + l0, &a0, &a1);
        r->w[0] = (uint32_t)a0;
        r->w[1] = (uint32_t)a1;
        if (five) {
            dd_ld_a8(b + 16 + l0, &a0, &a1);
            r->w[2] = (uint32_t)a0;
            r->w[3] = (uint32_t)a1;
        }
        /* the header in four 4-byte loads (blocks of 144 and 176 bytes stay 16-byte aligned) */
        QB_UNROLL
        for (int j = 0; j < 4; j++) r->w[4 + j] = (uint32_t)dd_ld_a4(b + 4 * j);
        break;
    }
    default: {   /* GGML_TYPE_Q6_K */
        const int k = i & 15, h = k >> 3, a = (k >> 2) & 1, l0 = 8 * (k & 3);
        const uint8_t *b = row + (size_t)(i >> 4) * 210;
        const uint8_t *ql = b + 64 * h + 32 * a + l0, *qh = b + 128 + 32 * h + l0;
        QB_UNROLL
        for (int j = 0; j < 4; j++) {
            r->w[j] = dd_ld_u16(ql + 2 * j);
            r->w[4 + j] = dd_ld_u16(qh + 2 * j);
        }
        r->w[8] = dd_ld_u16(b + 208);
        const int8_t *S = (const int8_t *)(b + 192 + 8 * h + (l0 >= 16));
        r->w[9] = (uint32_t)(int)S[2 * a];
        r->w[10] = (uint32_t)(int)S[2 * a + 4];
        break;
    }
    }
}

/* Item i unpacked from its bytes r (dd_fetch's): no loads. */
QB_HD void dd_unpack(uint32_t type, const dd_raw *r, int i, dd_item *it)
{
    it->m[0] = it->m[1] = 0.0f;
    switch (type) {
    case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: {
        /* block i / 2; item k = i % 2 holds code bytes 8k..8k+7: values 8k.. (low nibbles) and
         * 16 + 8k.. (high nibbles) */
        const int five = type == GGML_TYPE_Q5_0, k = i & 1;
        const int a0 = dd_join(r->w[0], r->w[1]), a1 = dd_join(r->w[2], r->w[3]);
        int v0 = a0 & 0x0F0F0F0F, v1 = a1 & 0x0F0F0F0F, v2 = (a0 >> 4) & 0x0F0F0F0F, v3 = (a1 >> 4) & 0x0F0F0F0F;
        if (five) {
            const uint32_t qh = (uint32_t)dd_join(r->w[4], r->w[5]) >> (8 * k);
            v0 |= dd_bits_to_byte4(qh & 15u);
            v1 |= dd_bits_to_byte4((qh >> 4) & 15u);
            v2 |= dd_bits_to_byte4((qh >> 16) & 15u);
            v3 |= dd_bits_to_byte4((qh >> 20) & 15u);
        }
        const uint32_t half = five ? 16u : 8u;
        it->v[0] = dd_centre(v0, half);
        it->v[1] = dd_centre(v1, half);
        it->v[2] = dd_centre(v2, half);
        it->v[3] = dd_centre(v3, half);
        it->pos[0] = 32 * (i >> 1) + 8 * k;
        it->pos[1] = it->pos[0] + 16;
        it->s[0] = it->s[1] = qb_half(r->w[6]);
        break;
    }
    case GGML_TYPE_Q8_0: {
        /* block i / 2; item k: values 16k..16k+15 */
        QB_UNROLL
        for (int j = 0; j < 4; j++) it->v[j] = dd_join(r->w[2 * j], r->w[2 * j + 1]);
        it->pos[0] = 16 * i;
        it->pos[1] = 16 * i + 8;
        it->s[0] = it->s[1] = qb_half(r->w[8]);
        break;
    }
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: {
        /* super-block i / 16; item k = i % 16: pair p = k / 4 of sub-blocks, positions l0 = 8 (k % 4)
         * .. l0 + 7 of sub-blocks 2p (low nibbles) and 2p + 1 (high nibbles) */
        const int five = type == GGML_TYPE_Q5_K, k = i & 15, p = k >> 2, l0 = 8 * (k & 3);
        const int a0 = (int)r->w[0], a1 = (int)r->w[1];
        int v0 = a0 & 0x0F0F0F0F, v1 = a1 & 0x0F0F0F0F, v2 = (a0 >> 4) & 0x0F0F0F0F, v3 = (a1 >> 4) & 0x0F0F0F0F;
        if (five) {
            const uint32_t h0 = r->w[2], h1 = r->w[3];
            v0 |= (int)(((h0 >> (2 * p)) & 0x01010101u) << 4);
            v1 |= (int)(((h1 >> (2 * p)) & 0x01010101u) << 4);
            v2 |= (int)(((h0 >> (2 * p + 1)) & 0x01010101u) << 4);
            v3 |= (int)(((h1 >> (2 * p + 1)) & 0x01010101u) << 4);
        }
        it->v[0] = v0;
        it->v[1] = v1;
        it->v[2] = v2;
        it->v[3] = v3;
        const uint32_t dm = r->w[4];
        const float d = qb_half(dm & 0xFFFFu), dmin = qb_half(dm >> 16);
        for (int g = 0; g < 2; g++) {
            int sc, mn;
            qb_scale_min_w(r->w[5], r->w[6], r->w[7], 2 * p + g, &sc, &mn);
            it->s[g] = QB_MUL(d, (float)sc);
            it->m[g] = QB_MUL(dmin, (float)mn);
            it->pos[g] = 256 * (i >> 4) + 32 * (2 * p + g) + l0;
        }
        break;
    }
    default: {   /* GGML_TYPE_Q6_K */
        /* super-block i / 16; item k = i % 16: half h = k / 8, a = (k / 4) % 2, positions l0 = 8 (k %
         * 4) .. l0 + 7 of sub-blocks 4h + a (low nibbles of ql, qh bits 2a) and 4h + a + 2 (high
         * nibbles, qh bits 2a + 4) */
        const int k = i & 15, h = k >> 3, a = (k >> 2) & 1, l0 = 8 * (k & 3);
        const int a0 = dd_join(r->w[0], r->w[1]), a1 = dd_join(r->w[2], r->w[3]);
        const uint32_t h0 = (uint32_t)dd_join(r->w[4], r->w[5]), h1 = (uint32_t)dd_join(r->w[6], r->w[7]);
        it->v[0] = dd_centre((a0 & 0x0F0F0F0F) | (int)(((h0 >> (2 * a)) & 0x03030303u) << 4), 32u);
        it->v[1] = dd_centre((a1 & 0x0F0F0F0F) | (int)(((h1 >> (2 * a)) & 0x03030303u) << 4), 32u);
        it->v[2] = dd_centre(((a0 >> 4) & 0x0F0F0F0F) | (int)(((h0 >> (2 * a + 4)) & 0x03030303u) << 4), 32u);
        it->v[3] = dd_centre(((a1 >> 4) & 0x0F0F0F0F) | (int)(((h1 >> (2 * a + 4)) & 0x03030303u) << 4), 32u);
        const float d = qb_half(r->w[8]);
        it->s[0] = QB_MUL(d, (float)(int)r->w[9]);
        it->s[1] = QB_MUL(d, (float)(int)r->w[10]);
        it->pos[0] = 256 * (i >> 4) + 32 * (4 * h + a) + l0;
        it->pos[1] = it->pos[0] + 64;
        break;
    }
    }
}

/* Item i of a row, loaded and unpacked. */
QB_HD void dd_load(uint32_t type, const uint8_t *row, int i, dd_item *it)
{
    dd_raw r;
    dd_fetch(type, row, i, &r);
    dd_unpack(type, &r, i, it);
}

/* A token's 16 codes for an item (from the whole row's codes xq): u[0], u[1] group 0's, u[2], u[3]
 * group 1's. The same for every row at item i, so a warp over several rows loads them once. */
QB_HD void dd_icodes(const dd_item *it, const int8_t *xq, int *u)
{
    dd_ld_a8(xq + it->pos[0], &u[0], &u[1]);
    dd_ld_a8(xq + it->pos[1], &u[2], &u[3]);
}

/* The item's dot product with a token's codes u, xa and xb the scales of the activation blocks of
 * its groups (xd[pos[0] / 32], xd[pos[1] / 32]). Q4_0/Q5_0/Q8_0 items lie in one block of
 * activations with one weight scale: their 16 products are summed as integers. */
QB_HD float dd_item_dot(uint32_t type, const dd_item *it, const int *u, float xa, float xb)
{
    const int i0 = dd_dp4a(it->v[1], u[1], dd_dp4a(it->v[0], u[0], 0));
    const int i1 = dd_dp4a(it->v[3], u[3], dd_dp4a(it->v[2], u[2], 0));
    if (type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q5_0 || type == GGML_TYPE_Q8_0)
        return QB_MUL(QB_MUL(xa, it->s[0]), (float)(i0 + i1));
    float t0 = QB_MUL(it->s[0], (float)i0), t1 = QB_MUL(it->s[1], (float)i1);
    if (type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K) {
        /* the minimum times the sum of the group's activation codes */
        const int ones = 0x01010101;
        t0 = QB_SUB(t0, QB_MUL(it->m[0], (float)dd_dp4a(ones, u[1], dd_dp4a(ones, u[0], 0))));
        t1 = QB_SUB(t1, QB_MUL(it->m[1], (float)dd_dp4a(ones, u[3], dd_dp4a(ones, u[2], 0))));
    }
    return QB_ADD(QB_MUL(xa, t0), QB_MUL(xb, t1));
}

/* One lane's share of n_rows (<= DD_MAX_ROWS) quantized rows, `stride` bytes apart, of n_in values
 * (a multiple of 256 for the K-quants, of 32 otherwise) times n_tok (<= QB_MAX_TOK) tokens: items
 * lane, lane + lanes, ..., each added to acc[r][t] in that order. Token t's codes are xq[t * n_in
 * ...], its scales xd[t * n_in / 32 ...], loaded once for all the rows. inflight (1 to
 * DD_MAX_INFLIGHT) items of every row are loaded before any is used, so that a lane has that many
 * reads of each row in flight (a warp per row leaves few warps to hide the memory's latency
 * otherwise; more in flight takes more registers, so fewer warps: the GPU measures which wins; 4
 * took 72-123 registers in a kernel for up to 8 tokens, so only the one-token kernels, whose
 * accumulators and activations for tokens 1-7 compile away, take 4). A row's sums are the same bits
 * for every inflight and n_rows. The loops run to constants so that the items and acc stay in
 * registers on the device. */
#define DD_MAX_INFLIGHT 4
#define DD_MAX_ROWS 2
QB_HD void dd_lane_dot_q(uint32_t type, const uint8_t *row, size_t stride, int n_rows, int64_t n_in, const int8_t *xq,
                         const float *xd, int n_tok, int lane, int lanes, int inflight, float (*acc)[QB_MAX_TOK])
{
    const int n_items = (int)(n_in / DD_ITEM);
    const int64_t nb = n_in / DD_QBLOCK;
    for (int i0 = lane; i0 < n_items; i0 += inflight * lanes) {
        /* every item's loads first (an item past the row's end loads item i0 again, unused, so that
         * no branch stands between the loads), then each item unpacked and used */
        dd_raw raw[DD_MAX_INFLIGHT][DD_MAX_ROWS];
        QB_UNROLL
        for (int u = 0; u < DD_MAX_INFLIGHT; u++)
            if (u < inflight) {
                const int i = i0 + u * lanes < n_items ? i0 + u * lanes : i0;
                QB_UNROLL
                for (int r = 0; r < DD_MAX_ROWS; r++)
                    if (r < n_rows) dd_fetch(type, row + (size_t)r * stride, i, &raw[u][r]);
            }
        /* every item is used, one past the end (item i0 again) added to nothing: a use only some
         * lanes reach would let the compiler move that item's loads after the others' use */
        QB_UNROLL
        for (int u = 0; u < DD_MAX_INFLIGHT; u++) {
            if (u >= inflight) break;
            const int in_row = i0 + u * lanes < n_items, i = in_row ? i0 + u * lanes : i0;
            dd_item it[DD_MAX_ROWS];
            QB_UNROLL
            for (int r = 0; r < DD_MAX_ROWS; r++)
                if (r < n_rows) dd_unpack(type, &raw[u][r], i, &it[r]);
            QB_UNROLL
            for (int t = 0; t < QB_MAX_TOK; t++) {
                if (t >= n_tok) continue;
                int c[4];
                dd_icodes(&it[0], xq + (int64_t)t * n_in, c);
                const float *dt = xd + (int64_t)t * nb;
                const float xa = dt[it[0].pos[0] >> 5], xb = dt[it[0].pos[1] >> 5];
                QB_UNROLL
                for (int r = 0; r < DD_MAX_ROWS; r++) {
                    if (r >= n_rows) continue;
                    const float sum = QB_ADD(acc[r][t], dd_item_dot(type, &it[r], c, xa, xb));
                    acc[r][t] = in_row ? sum : acc[r][t];
                }
            }
        }
    }
}

/* The wide path of Q4_K and Q5_K (their blocks of 144 and 176 bytes keep every row 16-byte
 * aligned): a lane takes 32 values at a time, 16 of sub-block 2p and the 16 at the same places of
 * sub-block 2p + 1 (one 16-byte load of the codes they share, one of the header, and for Q5_K one of
 * the high bits), against the 16 + 8 values and four header loads of dd_fetch. A token's codes come
 * in two 16-byte loads for any number of rows (dd_lane_dot_w multiplies up to DD_MAX_ROWS rows of a
 * warp by each), and the minimums' terms use the block sums of the activations (dd_quantize's s)
 * instead of a dot product with ones: the lane holding the first half of the two sub-blocks adds
 * -(m_A s_A + m_B s_B) for all 64 values. Item i: super-block i / 8, k = i % 8, pair p = k / 2,
 * positions l0 = 16 (k % 2) .. l0 + 15 of sub-blocks 2p and 2p + 1. */
#define DD_WITEM 32

QB_HD int dd_wide_type(uint32_t type) { return type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K; }

typedef struct {
    int v[8];        /* v[0..3]: sub-block A's 16 codes (values pos ..), v[4..7]: B's (pos + 32 ..) */
    float s[2], m[2];
    int pos;
    int first;       /* l0 == 0: this lane adds the two sub-blocks' minimum terms */
} dd_witem;

/* A wide item's bytes as loaded (dd_wfetch), not yet used: the codes, the header, the high bits. */
typedef struct {
    uint32_t q[4], hd[4], h[4];
} dd_wraw;

/* Wide item i of a row: its loads only (dd_raw says why apart). */
QB_HD void dd_wfetch(uint32_t type, const uint8_t *row, int i, dd_wraw *r)
{
    const int five = type == GGML_TYPE_Q5_K, k = i & 7, p = k >> 1, l0 = 16 * (k & 1);
    const uint8_t *b = row + (size_t)(i >> 3) * (five ? 176 : 144);
    qb_load16(b + (five ? 48 : 16) + 32 * p + l0, r->q);
    qb_load16(b, r->hd);
    if (five) qb_load16(b + 16 + l0, r->h);
    else r->h[0] = r->h[1] = r->h[2] = r->h[3] = 0;
}

/* Wide item i unpacked from its bytes r (dd_wfetch's): no loads. */
QB_HD void dd_wunpack(uint32_t type, const dd_wraw *r, int i, dd_witem *it)
{
    const int five = type == GGML_TYPE_Q5_K, k = i & 7, p = k >> 1, l0 = 16 * (k & 1);
    QB_UNROLL
    for (int j = 0; j < 4; j++) {
        uint32_t lo = r->q[j] & 0x0F0F0F0Fu, hi = (r->q[j] >> 4) & 0x0F0F0F0Fu;
        if (five) {
            lo |= ((r->h[j] >> (2 * p)) & 0x01010101u) << 4;
            hi |= ((r->h[j] >> (2 * p + 1)) & 0x01010101u) << 4;
        }
        it->v[j] = (int)lo;
        it->v[4 + j] = (int)hi;
    }
    const float d = qb_half(r->hd[0] & 0xFFFFu), dmin = qb_half(r->hd[0] >> 16);
    QB_UNROLL
    for (int g = 0; g < 2; g++) {
        int sc, mn;
        qb_scale_min_w(r->hd[1], r->hd[2], r->hd[3], 2 * p + g, &sc, &mn);
        it->s[g] = QB_MUL(d, (float)sc);
        it->m[g] = QB_MUL(dmin, (float)mn);
    }
    it->pos = 256 * (i >> 3) + 64 * p + l0;
    it->first = l0 == 0;
}

/* Wide item i of a row, loaded and unpacked. */
QB_HD void dd_wload(uint32_t type, const uint8_t *row, int i, dd_witem *it)
{
    dd_wraw r;
    dd_wfetch(type, row, i, &r);
    dd_wunpack(type, &r, i, it);
}

/* A token's 32 codes for items at pos (u[0..3] sub-block A's, u[4..7] B's). */
QB_HD void dd_wcodes(const int8_t *xq, int pos, uint32_t *u)
{
    qb_load16(xq + pos, u);
    qb_load16(xq + pos + 32, u + 4);
}

/* The item's dot product with a token's codes u, the scales of its blocks xa, xb and their sums sa,
 * sb (read only by the first lane). */
QB_HD float dd_wide_dot(const dd_witem *it, const uint32_t *u, float xa, float xb, float sa, float sb)
{
    int ia = 0, ib = 0;
    QB_UNROLL
    for (int j = 0; j < 4; j++) {
        ia = dd_dp4a(it->v[j], (int)u[j], ia);
        ib = dd_dp4a(it->v[4 + j], (int)u[4 + j], ib);
    }
    float r = QB_ADD(QB_MUL(xa, QB_MUL(it->s[0], (float)ia)), QB_MUL(xb, QB_MUL(it->s[1], (float)ib)));
    if (it->first) r = QB_SUB(r, QB_ADD(QB_MUL(it->m[0], sa), QB_MUL(it->m[1], sb)));
    return r;
}

/* One lane's share of n_rows (<= DD_MAX_ROWS) Q4_K/Q5_K rows, `stride` bytes apart, of n_in values
 * (a multiple of 256) times n_tok (<= QB_MAX_TOK) tokens: items lane, lane + lanes, ..., each added
 * to acc[r][t] in that order; inflight (1 to DD_MAX_INFLIGHT) items of every row are loaded before any is used.
 * Token t's codes are xq[t * n_in ...], its scales xd[t * n_in / 32 ...] and block sums xs[t * n_in /
 * 32 ...]. A row's sums do not depend on n_rows or inflight. */
QB_HD void dd_lane_dot_w(uint32_t type, const uint8_t *row, size_t stride, int n_rows, int64_t n_in,
                         const int8_t *xq, const float *xd, const float *xs, int n_tok, int lane, int lanes,
                         int inflight, float (*acc)[QB_MAX_TOK])
{
    const int n_items = (int)(n_in / DD_WITEM);
    const int64_t nb = n_in / DD_QBLOCK;
    for (int i0 = lane; i0 < n_items; i0 += inflight * lanes) {
        /* every item's loads first, then each unpacked and used (as dd_lane_dot_q) */
        dd_wraw raw[DD_MAX_INFLIGHT][DD_MAX_ROWS];
        QB_UNROLL
        for (int u = 0; u < DD_MAX_INFLIGHT; u++)
            if (u < inflight) {
                const int i = i0 + u * lanes < n_items ? i0 + u * lanes : i0;
                QB_UNROLL
                for (int r = 0; r < DD_MAX_ROWS; r++)
                    if (r < n_rows) dd_wfetch(type, row + (size_t)r * stride, i, &raw[u][r]);
            }
        QB_UNROLL
        for (int u = 0; u < DD_MAX_INFLIGHT; u++) {   /* every item used, as in dd_lane_dot_q */
            if (u >= inflight) break;
            const int in_row = i0 + u * lanes < n_items, i = in_row ? i0 + u * lanes : i0;
            dd_witem it[DD_MAX_ROWS];
            QB_UNROLL
            for (int r = 0; r < DD_MAX_ROWS; r++)
                if (r < n_rows) dd_wunpack(type, &raw[u][r], i, &it[r]);
            const int pos = it[0].pos, b = pos >> 5;
            QB_UNROLL
            for (int t = 0; t < QB_MAX_TOK; t++) {
                if (t >= n_tok) continue;
                uint32_t c[8];
                dd_wcodes(xq + (int64_t)t * n_in, pos, c);
                const float *dt = xd + (int64_t)t * nb, *st = xs + (int64_t)t * nb;
                const float xa = dt[b], xb = dt[b + 1];
                float sa = 0.0f, sb = 0.0f;
                if (it[0].first) {
                    sa = st[b];
                    sb = st[b + 1];
                }
                QB_UNROLL
                for (int r = 0; r < DD_MAX_ROWS; r++) {
                    if (r >= n_rows) continue;
                    const float sum = QB_ADD(acc[r][t], dd_wide_dot(&it[r], c, xa, xb, sa, sb));
                    acc[r][t] = in_row ? sum : acc[r][t];
                }
            }
        }
    }
}

/* 8 values of an F16 or BF16 row from 16 bytes. */
QB_HD void dd_load_h(uint32_t type, const uint8_t *p, float *w)
{
    uint32_t u[4];
    qb_load16(p, u);
    for (int j = 0; j < 4; j++) {
        w[2 * j] = type == GGML_TYPE_F16 ? qb_half(u[j] & 0xFFFFu) : qb_bf16(u[j] & 0xFFFFu);
        w[2 * j + 1] = type == GGML_TYPE_F16 ? qb_half(u[j] >> 16) : qb_bf16(u[j] >> 16);
    }
}

/* One lane's share of n_rows (<= DD_MAX_ROWS) F16/BF16 rows, `stride` bytes apart, of n_in values (a
 * multiple of 8; the rows 16-byte aligned) times n_tok f32 token rows x[t * n_in ...] (16-byte
 * aligned): 8 values lane, lane + lanes, ..., each multiplied and added into acc[r][t] in order by
 * fused multiply-adds, each token's 8 activations loaded once for all the rows. inflight (1 to
 * DD_MAX_INFLIGHT) items of every row are loaded before any is used: with one, a lane waited for
 * each 16 bytes before asking for the next, and the H200's times fit that chain of round trips
 * (docs/gpu.md, stage 1's third part). A row's sums do not depend on inflight. */
QB_HD void dd_lane_dot_h(uint32_t type, const uint8_t *row, size_t stride, int n_rows, int64_t n_in, const float *x,
                         int n_tok, int lane, int lanes, int inflight, float (*acc)[QB_MAX_TOK])
{
    const int n_items = (int)(n_in / DD_HITEM);
    for (int i0 = lane; i0 < n_items; i0 += inflight * lanes) {
        float w[DD_MAX_INFLIGHT][DD_MAX_ROWS][8];
        QB_UNROLL
        for (int u = 0; u < DD_MAX_INFLIGHT; u++)
            if (u < inflight && i0 + u * lanes < n_items) {
                QB_UNROLL
                for (int r = 0; r < DD_MAX_ROWS; r++)
                    if (r < n_rows)
                        dd_load_h(type, row + (size_t)r * stride + (size_t)(i0 + u * lanes) * 16, w[u][r]);
            }
        QB_UNROLL
        for (int u = 0; u < DD_MAX_INFLIGHT; u++) {
            if (u >= inflight || i0 + u * lanes >= n_items) break;
            const int i = i0 + u * lanes;
            QB_UNROLL
            for (int t = 0; t < QB_MAX_TOK; t++) {
                if (t >= n_tok) continue;
                float xv[8];
                const float *xt = x + (int64_t)t * n_in + (int64_t)i * DD_HITEM;
#ifdef __CUDA_ARCH__
                const float4 p = *(const float4 *)xt, q = *(const float4 *)(xt + 4);
                xv[0] = p.x; xv[1] = p.y; xv[2] = p.z; xv[3] = p.w;
                xv[4] = q.x; xv[5] = q.y; xv[6] = q.z; xv[7] = q.w;
#else
                memcpy(xv, xt, sizeof xv);
#endif
                QB_UNROLL
                for (int r = 0; r < DD_MAX_ROWS; r++) {
                    if (r >= n_rows) continue;
                    float a = acc[r][t];
                    for (int j = 0; j < 8; j++) a = fmaf(w[u][r][j], xv[j], a);
                    acc[r][t] = a;
                }
            }
        }
    }
}

/* One lane's share of n_rows (<= DD_MAX_ROWS) rows of any type the decode kernel reads, as the
 * kernel dispatches it: Q4_K/Q5_K with `wide` by dd_lane_dot_w (the tokens' codes xq, scales xd and
 * block sums xs), the other quantized types by dd_lane_dot_q (xq, xd), F16/BF16 by dd_lane_dot_h
 * (the f32 tokens x); inflight reads of each row in flight a lane. */
QB_HD void dd_lane_dot(uint32_t type, int wide, const uint8_t *row, size_t stride, int n_rows, int64_t n_in,
                       const float *x, const int8_t *xq, const float *xd, const float *xs, int n_tok, int lane,
                       int lanes, int inflight, float (*acc)[QB_MAX_TOK])
{
    if (wide && dd_wide_type(type))
        dd_lane_dot_w(type, row, stride, n_rows, n_in, xq, xd, xs, n_tok, lane, lanes, inflight, acc);
    else if (dd_integer_type(type))
        dd_lane_dot_q(type, row, stride, n_rows, n_in, xq, xd, n_tok, lane, lanes, inflight, acc);
    else
        dd_lane_dot_h(type, row, stride, n_rows, n_in, x, n_tok, lane, lanes, inflight, acc);
}

/* A decode kernel's warp over one row, run on the host: every lane's share (dd_lane_dot, inflight
 * reads at a time), then the lanes' sums met as the kernel's shuffles meet them, a butterfly (lane
 * l adds lane l ^ o's sum, o = 16 .. 1). y[t] gets token t's product: the device's bits. */
static inline void dd_warp_row(uint32_t type, const uint8_t *row, int64_t n_in, const float *x, const int8_t *xq,
                               const float *xd, const float *xs, int n_tok, int inflight, int wide, float *y)
{
    float acc[32][QB_MAX_TOK];
    memset(acc, 0, sizeof acc);
    for (int lane = 0; lane < 32; lane++)
        dd_lane_dot(type, wide, row, 0, 1, n_in, x, xq, xd, xs, n_tok, lane, 32, inflight, &acc[lane]);
    for (int t = 0; t < n_tok; t++) {
        float v[32], w[32];
        for (int l = 0; l < 32; l++) v[l] = acc[l][t];
        for (int o = 16; o > 0; o >>= 1) {
            for (int l = 0; l < 32; l++) w[l] = v[l] + v[l ^ o];
            memcpy(v, w, sizeof w);
        }
        y[t] = v[0];
    }
}

/* ---------------------------------------------------------------- several products a launch */

#define DD_MAX_OUTS 4   /* products of one input and one weight type that one decode launch computes */

/* The products of one decode launch (the q, k and v of a layer; gate and up): weight i's n_out[i]
 * rows (each `stride` bytes, the same for all: one type, one n_in) into y[i], computed by the
 * grid's blocks first[i] to first[i + 1] - 1. One launch instead of n: each launch is microseconds
 * of the host's time, and a decode step is bound by it on small models. */
typedef struct dd_outs {
    const uint8_t *w[DD_MAX_OUTS];
    float *y[DD_MAX_OUTS];
    int32_t n_out[DD_MAX_OUTS];   /* 32 bits: fewer registers (a weight's rows are far fewer) */
    int32_t first[DD_MAX_OUTS];
    int n;
} dd_outs;

/* Give each of o's n products its blocks of rows_a_block rows, in order: first[]; the grid's
 * blocks. */
static inline int64_t dd_outs_layout(dd_outs *o, int32_t rows_a_block)
{
    int64_t blocks = 0;
    for (int i = 0; i < o->n; i++) {
        o->first[i] = (int32_t)blocks;
        blocks += (o->n_out[i] + rows_a_block - 1) / rows_a_block;
    }
    return blocks;
}

/* What block `block` of the grid computes: the last product whose first block is at or before it
 * (its weight, rows, and the block's place among that product's blocks). Unrolled with constant
 * indices, so a kernel reads its parameters in place rather than through a local copy. */
QB_HD void dd_outs_block(const dd_outs *o, int32_t block, const uint8_t **w, int32_t *n_out, int32_t *local)
{
    *w = o->w[0];
    *n_out = o->n_out[0];
    *local = block;
    QB_UNROLL
    for (int i = 1; i < DD_MAX_OUTS; i++) {
        if (i < o->n && block >= o->first[i]) {
            *w = o->w[i];
            *n_out = o->n_out[i];
            *local = block - o->first[i];
        }
    }
}

/* That product's output (apart, so that a kernel holds it only once its sums are done). */
QB_HD float *dd_outs_y(const dd_outs *o, int32_t block)
{
    float *y = o->y[0];
    QB_UNROLL
    for (int i = 1; i < DD_MAX_OUTS; i++)
        if (i < o->n && block >= o->first[i]) y = o->y[i];
    return y;
}

/* The decode kernels' shape for a launch of several tokens (2 to QB_MAX_TOK) over n_out rows in
 * all (its products' together) on a device of n_sm multiprocessors: rows a warp, and on one row the
 * reads of it a lane keeps in flight on one row (two rows hold one item of each). From the H200's table of
 * 2026-11-30 (bench/gpu_kernels.csv, docs/gpu.md; tests/test_quant_blocks.c holds the rule to it):
 * two rows (each token's activations loaded once for both) won from 4 tokens where half the rows
 * still give every multiprocessor 32 warps (a 7B's 14336-row products), but not on Q8_0, whose
 * long items made them 1.2x slower; on 4096 rows they left too few warps (F16 4096 x 14336 at 2
 * tokens 1.9x slower). One row: a read in flight on Q4_0 and the wide path's Q4_K/Q5_K (two were
 * up to 1.8x slower there) and on F16/BF16 (two spill), two on the others (Q5_0 4096 x 14336 1.3x
 * faster). */
typedef struct dd_many {
    int rows, inflight;
} dd_many;

QB_HD dd_many dd_many_shape(uint32_t type, int wide, int64_t n_out, int n_tok, int n_sm)
{
    dd_many s;
    s.rows = n_tok >= 4 && type != GGML_TYPE_Q8_0 && n_out / 2 >= (int64_t)32 * n_sm ? 2 : 1;
    /* one row's (two rows hold one item of each whatever it says, and KVCHAT_CUDA_MMV_ROWS=1 may
     * turn them into one) */
    s.inflight = type == GGML_TYPE_F16 || type == GGML_TYPE_BF16 || type == GGML_TYPE_Q4_0 || (wide && dd_wide_type(type))
                     ? 1
                     : 2;
    return s;
}

#endif
