/* attn_flash.h - a prefill chunk's attention on the tensor cores (flash attention over page lists),
 * per-warp work in one header for C and CUDA (issue 25, stage 3).
 *
 * A block takes rt tiles of 16 query rows and hb query heads of one KV head (a GQA group, in batches
 * of AG_HEADS), so each key tile it loads serves rt * 16 rows of hb heads, and one split of the
 * head's pages (when the row tiles alone would leave multiprocessors idle: a 512-query chunk of a
 * model with one KV head is 32 blocks; the splits' partials are merged by ag_combine_one, as the
 * grouped kernel's). Its warps: one per (row tile, head, half of the output dimensions when D > AF_DW). The keys go through shared memory in
 * tiles of AF_KT rows of one page (cp.async, two stages: the next tile loads while this one is used);
 * a page's rows past its count are zero-filled, and pages none of the block's rows can see (past
 * its last position, before its window, empty) are skipped whole.
 * Per tile and warp (af_warp_tile): the scores S = Q K^T of its 16 rows by m16n8k16 f16 products
 * with f32 accumulation (the query as a high and a low f16 part, two products, so the scores keep
 * about f32's precision: an f16 query alone would move a score of 10 by 5e-3), then the causal,
 * window and token-mask test and the merged tokens' bias, the online softmax of each row (running
 * maximum and sum; a row's four lanes meet by shuffles), and O += P V with the weights P rounded to
 * f16 (relative 2^-12 on average) as the product's A operand, the sum l taken over the same rounded
 * weights (each row stays a weighted average of its values). At the end each row is O / l.
 *
 * Every per-lane step is written once for a lane count nl: the device runs each lane alone (nl = 1,
 * the matrix products by the mma instruction, row sums by shuffles); af_attention_sim runs all 32
 * lanes of every warp on the host, emulating the products from the instruction's documented
 * fragment layout (tests/test_attn_kernels.c checks it against double precision and the CPU backend).
 * The device's products sum in their own order and its exponential is the fast one, so the GPU test
 * holds it to a tolerance of the simulation, not to its bits.
 *
 * Unlike the CPU and the grouped kernel, which skip keys a row cannot see, the product P V takes a
 * tile's every value row with weight 0 for those keys: a value of +-inf in the cache (an f16
 * overflow, which the cache does not saturate) gives NaN, not a finite answer, to the rows of its
 * tile that do not see it. */
#ifndef KVCHAT_ATTN_FLASH_H
#define KVCHAT_ATTN_FLASH_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attn_group.h"
#include "kernels/backend.h"
#include "kernels/quant_blocks.h"

#define AF_KT 32       /* keys a tile */
#define AF_WARPS 8     /* most warps a block */
#define AF_DW 128      /* output dimensions a warp holds at most (64 f32 registers) */
#define AF_PAD 8       /* halves after each shared row: consecutive rows start 4 banks apart */
#define AF_MIN_Q 16    /* queries from which a call runs this kernel */

#ifdef __CUDA_ARCH__
#define AF_NL 1
#else
#define AF_NL 32
#endif

/* Head dimensions it takes: whole k-steps of 16. */
QB_HD int af_supported(int D) { return D >= 16 && D % 16 == 0 && D <= 2 * AF_DW; }

/* A block's shape for head dimension D and a GQA group: hb heads (the batch's most), ds warps
 * sharing a row tile's output dimensions (dw each), rt row tiles, warps in all. */
typedef struct af_shape {
    int hb, ds, dw, rt, warps;
} af_shape;

QB_HD af_shape af_shape_of(int D, int group)
{
    af_shape s;
    s.hb = group < AG_HEADS ? group : AG_HEADS;
    s.ds = D > AF_DW ? 2 : 1;
    s.dw = D / s.ds;
    s.rt = AF_WARPS / (s.hb * s.ds);
    if (s.rt < 1) s.rt = 1;
    s.warps = s.rt * s.hb * s.ds;
    return s;
}

/* Shared memory: the queries' high and low halves [rt * hb][16][D + AF_PAD], then two stages of
 * keys and values [AF_KT][D + AF_PAD] each, then two stages of the keys' positions, biases and
 * visibility bytes. */
typedef struct af_stage {
    uint16_t *k, *v;
    int32_t *pos;
    float *bias;
    uint8_t *ok;
} af_stage;

typedef struct af_smem {
    uint16_t *qh, *ql;
    af_stage s0, s1;
} af_smem;

/* Stage st (0 or 1), chosen without indexing (an indexed array of pointers would sit in local
 * memory on the device). */
QB_HD af_stage af_stage_of(af_smem m, int st) { return st ? m.s1 : m.s0; }

QB_HD size_t af_smem_bytes(int D, af_shape s)
{
    const size_t row = (size_t)(D + AF_PAD) * 2;
    return 2 * (size_t)(s.rt * s.hb) * 16 * row + 2 * 2 * AF_KT * row + 2 * AF_KT * (4 + 4 + 1);
}

QB_HD af_smem af_smem_at(unsigned char *base, int D, af_shape s)
{
    af_smem m;
    const size_t row = (size_t)(D + AF_PAD), q = (size_t)(s.rt * s.hb) * 16 * row, kv = AF_KT * row;
    m.qh = (uint16_t *)base;
    m.ql = m.qh + q;
    m.s0.k = m.ql + q;
    m.s0.v = m.s0.k + kv;
    m.s1.k = m.s0.v + kv;
    m.s1.v = m.s1.k + kv;
    m.s0.pos = (int32_t *)(m.s1.v + kv);
    m.s1.pos = m.s0.pos + AF_KT;
    m.s0.bias = (float *)(m.s1.pos + AF_KT);
    m.s1.bias = m.s0.bias + AF_KT;
    m.s0.ok = (uint8_t *)(m.s1.bias + AF_KT);
    m.s1.ok = m.s0.ok + AF_KT;
    return m;
}

/* f32 to f16 bits, to the nearest, saturating at +-65504. */
QB_HD uint16_t af_f16(float x)
{
#ifdef __CUDA_ARCH__
    return __half_as_ushort(__float2half_rn(qb_f16_range(x)));
#else
    return quant_f32_to_fp16(qb_f16_range(x));
#endif
}

QB_HD uint32_t af_pack(float lo, float hi) { return (uint32_t)af_f16(lo) | (uint32_t)af_f16(hi) << 16; }

QB_HD uint32_t af_ld32(const uint16_t *p)
{
#ifdef __CUDA_ARCH__
    return *(const uint32_t *)p;
#else
    uint32_t u;
    memcpy(&u, p, 4);
    return u;
#endif
}

QB_HD float af_expf(float x)
{
#ifdef __CUDA_ARCH__
    return __expf(x);
#else
    return expf(x);
#endif
}

/* 16 bytes from global memory to shared memory, or 16 zero bytes (fill): cp.async on the device. */
QB_HD void af_cp16(uint16_t *dst, const uint16_t *src, int fill)
{
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(fill ? 0 : 16));
#else
    if (fill) memset(dst, 0, 16);
    else memcpy(dst, src, 16);
#endif
}

/* cp.async groups: close the copies issued so far; wait until at most one (or none) is open. */
QB_HD void af_cp_commit(void)
{
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
QB_HD void af_cp_wait1(void)
{
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.wait_group 1;\n" ::);
#endif
}
QB_HD void af_cp_wait0(void)
{
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.wait_group 0;\n" ::);
#endif
}

/* The block's query rows row0 .. row0 + rt * 16 of heads h0 .. h0 + hb_b into shared memory as high
 * and low halves (rows past n_q and heads past the batch: zero); element i of thread tid of nt. */
QB_HD void af_fill_q(af_smem m, const float *q, int64_t n_q, int n_head, int D, af_shape s, int64_t row0, int h0,
                     int hb_b, int tid, int nt)
{
    const int n = s.rt * s.hb * 16 * D;
    for (int i = tid; i < n; i += nt) {
        const int d = i % D, r = (i / D) % 16, th = i / (16 * D), hh = th % s.hb, rt = th / s.hb;
        const int64_t row = row0 + rt * 16 + r;
        const float x = row < n_q && hh < hb_b ? q[(row * n_head + h0 + hh) * (int64_t)D + d] : 0.0f;
        const uint16_t hi = af_f16(x);
        const size_t at = ((size_t)th * 16 + (size_t)r) * (size_t)(D + AF_PAD) + (size_t)d;
        m.qh[at] = hi;
        m.ql[at] = af_f16(QB_SUB(x, qb_half(hi)));
    }
}

/* Where the block's key tiles are: page ip of the head's list, rows r0 .. r0 + AF_KT. */
typedef struct af_cursor {
    int64_t ip;
    int32_t r0;
} af_cursor;

/* The first tile at or after (ip, r0) that some row of the block (positions minp .. maxp) can see:
 * pages with no rows, that start past maxp or whose last row is before every row's window are
 * skipped whole. ip == p1: none left. */
QB_HD af_cursor af_settle(const ag_page *pages, int64_t ip, int32_t r0, int64_t p1, int32_t minp, int32_t maxp,
                          int32_t window)
{
    while (ip < p1) {
        const ag_page *pg = &pages[ip];
        if (r0 < pg->n && pg->pos[0] <= maxp && !(window > 0 && (int64_t)minp - pg->pos[pg->n - 1] >= window)) break;
        ip++;
        r0 = 0;
    }
    af_cursor c = { ip, r0 };
    return c;
}

/* One tile's keys and values of KV head g into stage m (rows past the page's count zero-filled),
 * 16-byte pieces tid, tid + nt, ...; and (threads tid < AF_KT, or all with nt = 1) each key's
 * position, bias and whether its token mask lets it be seen. */
QB_HD void af_load_tile(af_stage m, const ag_page *pg, int32_t r0, const uint64_t *masks, int g, int D, int tid,
                        int nt)
{
    const int pieces = D / 8, n = 2 * AF_KT * pieces;
    const int64_t off = (int64_t)g * pg->head_step;
    for (int i = tid; i < n; i += nt) {
        const int isv = i >= AF_KT * pieces, j = (i % (AF_KT * pieces)) / pieces, c = i % pieces;
        const int32_t row = r0 + j;
        const uint16_t *base = isv ? pg->v : pg->k;
        uint16_t *dst = (isv ? m.v : m.k) + (size_t)j * (size_t)(D + AF_PAD) + (size_t)c * 8;
        af_cp16(dst, row < pg->n ? base + off + (int64_t)row * pg->stride + c * 8 : base, row >= pg->n);
    }
    for (int j = tid; j < AF_KT; j += nt) {
        const int32_t row = r0 + j;
        const int in = row < pg->n;
        m.pos[j] = in ? pg->pos[row] : INT32_MAX;
        m.bias[j] = in && pg->bias ? pg->bias[row] : 0.0f;
        m.ok[j] = (uint8_t)(in && (pg->mask_off < 0 || ((masks[pg->mask_off + (row >> 6)] >> (row & 63)) & 1u)));
    }
}

/* c += A B for each lane (m16n8k16, f16 in, f32 accumulation): lane l's four A registers at
 * a + l * as, two B registers at b + l * bs, four accumulators at c + l * cs. On the host the
 * warp's fragments are assembled (lane = 4 g + t: A rows g and g + 8, columns 2t, 2t + 1 and
 * 2t + 8, 2t + 9; B rows (k) 2t, 2t + 1 and 2t + 8, 2t + 9 of column g; C rows g, g + 8, columns
 * 2t, 2t + 1), multiplied with exact products summed in double, and scattered back. */
QB_HD void af_mma(int nl, float *c, int cs, const uint32_t *a, int as, const uint32_t *b, int bs)
{
#ifdef __CUDA_ARCH__
    (void)nl;
    (void)cs;
    (void)as;
    (void)bs;
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    float A[16][16], B[16][8];
    for (int l = 0; l < nl; l++) {
        const int g = l >> 2, t = l & 3;
        const uint32_t *al = a + (size_t)l * (size_t)as, *bl = b + (size_t)l * (size_t)bs;
        const int ar[4] = { g, g + 8, g, g + 8 }, ac[4] = { 2 * t, 2 * t, 2 * t + 8, 2 * t + 8 };
        for (int r = 0; r < 4; r++) {
            A[ar[r]][ac[r]] = qb_half(al[r] & 0xFFFFu);
            A[ar[r]][ac[r] + 1] = qb_half(al[r] >> 16);
        }
        B[2 * t][g] = qb_half(bl[0] & 0xFFFFu);
        B[2 * t + 1][g] = qb_half(bl[0] >> 16);
        B[2 * t + 8][g] = qb_half(bl[1] & 0xFFFFu);
        B[2 * t + 9][g] = qb_half(bl[1] >> 16);
    }
    float C[16][8];
    for (int l = 0; l < nl; l++) {
        const int g = l >> 2, t = l & 3;
        const float *cl = c + (size_t)l * (size_t)cs;
        C[g][2 * t] = cl[0];
        C[g][2 * t + 1] = cl[1];
        C[g + 8][2 * t] = cl[2];
        C[g + 8][2 * t + 1] = cl[3];
    }
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 8; n++) {
            double acc = C[r][n];
            for (int k = 0; k < 16; k++) acc += (double)A[r][k] * (double)B[k][n];
            C[r][n] = (float)acc;
        }
    for (int l = 0; l < nl; l++) {
        const int g = l >> 2, t = l & 3;
        float *cl = c + (size_t)l * (size_t)cs;
        cl[0] = C[g][2 * t];
        cl[1] = C[g][2 * t + 1];
        cl[2] = C[g + 8][2 * t];
        cl[3] = C[g + 8][2 * t + 1];
    }
#endif
}

/* x[l][0..1] (rows g and g + 8) met over the four lanes of each g: the largest (max) or the sum,
 * by the butterfly of shuffles 1 then 2. */
QB_HD void af_quad(int nl, float (*x)[2], int max)
{
#ifdef __CUDA_ARCH__
    (void)nl;
    QB_UNROLL
    for (int h = 0; h < 2; h++)
        QB_UNROLL
        for (int o = 1; o <= 2; o <<= 1) {
            const float y = __shfl_xor_sync(0xffffffffu, x[0][h], o);
            x[0][h] = max ? fmaxf(x[0][h], y) : QB_ADD(x[0][h], y);
        }
#else
    for (int h = 0; h < 2; h++)
        for (int o = 1; o <= 2; o <<= 1) {
            float y[32];
            for (int l = 0; l < nl; l++) y[l] = max ? fmaxf(x[l][h], x[l ^ o][h]) : QB_ADD(x[l][h], x[l ^ o][h]);
            for (int l = 0; l < nl; l++) x[l][h] = y[l];
        }
#endif
}

/* One warp's state: per lane, rows g and g + 8's running maximum and sum, and the output
 * accumulators of its dw dimensions (n-tile nt: columns 2t, 2t + 1 of rows g, g + 8). */
typedef struct af_lane {
    float m[2], l[2];
    float o[AF_DW / 8][4];
} af_lane;

QB_HD void af_lane_init(af_lane *s)
{
    QB_UNROLL
    for (int h = 0; h < 2; h++) s->m[h] = -INFINITY, s->l[h] = 0.0f;
    QB_UNROLL
    for (int nt = 0; nt < AF_DW / 8; nt++)
        QB_UNROLL
        for (int e = 0; e < 4; e++) s->o[nt][e] = 0.0f;
}

/* One key tile (stage m) for one warp: lanes lane0 .. lane0 + nl (device: its own; host: all 32)
 * with their rows' positions qp[l][0..1] (INT32_MIN: no row), the warp's query rows qh/ql
 * ([16][D + AF_PAD]), output dimensions d0 .. d0 + dw. */
QB_HD void af_warp_tile(af_stage m, const uint16_t *qh, const uint16_t *ql, int D, int d0, int dw,
                        int32_t window, int has_bias, const int32_t (*qp)[2], int lane0, int nl, af_lane *s)
{
    const int rs = D + AF_PAD;
    const uint16_t *K = m.k, *V = m.v;
    float sc[AF_NL][4][4];
    for (int l = 0; l < nl; l++)
        QB_UNROLL
        for (int nt = 0; nt < 4; nt++)
            QB_UNROLL
            for (int e = 0; e < 4; e++) sc[l][nt][e] = 0.0f;
    for (int k0 = 0; k0 < D; k0 += 16) {
        uint32_t ah[AF_NL][4], al[AF_NL][4], b[AF_NL][4][2];
        for (int l = 0; l < nl; l++) {
            const int g = (lane0 + l) >> 2, t = (lane0 + l) & 3;
            const int at[4] = { g * rs + k0 + 2 * t, (g + 8) * rs + k0 + 2 * t, g * rs + k0 + 2 * t + 8,
                                (g + 8) * rs + k0 + 2 * t + 8 };
            QB_UNROLL
            for (int r = 0; r < 4; r++) ah[l][r] = af_ld32(qh + at[r]), al[l][r] = af_ld32(ql + at[r]);
            QB_UNROLL
            for (int nt = 0; nt < 4; nt++) {
                b[l][nt][0] = af_ld32(K + (nt * 8 + g) * rs + k0 + 2 * t);
                b[l][nt][1] = af_ld32(K + (nt * 8 + g) * rs + k0 + 2 * t + 8);
            }
        }
        QB_UNROLL
        for (int nt = 0; nt < 4; nt++) {
            af_mma(nl, &sc[0][nt][0], 16, &ah[0][0], 4, &b[0][nt][0], 8);
            af_mma(nl, &sc[0][nt][0], 16, &al[0][0], 4, &b[0][nt][0], 8);
        }
    }
    /* which keys each row sees, the bias, and each row's largest score */
    float mx[AF_NL][2];
    for (int l = 0; l < nl; l++) {
        const int t = (lane0 + l) & 3;
        mx[l][0] = mx[l][1] = -INFINITY;
        QB_UNROLL
        for (int nt = 0; nt < 4; nt++)
            QB_UNROLL
            for (int e = 0; e < 4; e++) {
                const int key = nt * 8 + 2 * t + (e & 1);
                const int32_t q = qp[l][e >> 1], kp = m.pos[key];
                const int vis = m.ok[key] && kp <= q && !(window > 0 && (int64_t)q - kp >= window);
                float v = -INFINITY;
                if (vis) v = has_bias ? QB_ADD(sc[l][nt][e], m.bias[key]) : sc[l][nt][e];
                sc[l][nt][e] = v;
                mx[l][e >> 1] = fmaxf(mx[l][e >> 1], v);
            }
    }
    af_quad(nl, mx, 1);
    /* the online softmax: rescale to the new maximum, the tile's weights and their sums */
    float f[AF_NL][2], sum[AF_NL][2];
    uint32_t pa[AF_NL][2][4];
    for (int l = 0; l < nl; l++) {
        QB_UNROLL
        for (int h = 0; h < 2; h++) {
            const float mn = fmaxf(s[l].m[h], mx[l][h]);
            f[l][h] = mn == -INFINITY ? 1.0f : af_expf(QB_SUB(s[l].m[h], mn));
            s[l].m[h] = mn;
            sum[l][h] = 0.0f;
        }
        QB_UNROLL
        for (int nt = 0; nt < 4; nt++) {
            float p[4];
            QB_UNROLL
            for (int e = 0; e < 4; e++) {
                /* the weight as the product will take it (f16), so the sum normalises what is added */
                p[e] = sc[l][nt][e] == -INFINITY ? 0.0f : qb_half(af_f16(af_expf(QB_SUB(sc[l][nt][e], s[l].m[e >> 1]))));
                sum[l][e >> 1] = QB_ADD(sum[l][e >> 1], p[e]);
            }
            /* the A fragment of keys 16 (nt / 2) ..: rows g, g + 8 at columns 2t, then 2t + 8 */
            pa[l][nt >> 1][(nt & 1) * 2] = af_pack(p[0], p[1]);
            pa[l][nt >> 1][(nt & 1) * 2 + 1] = af_pack(p[2], p[3]);
        }
    }
    af_quad(nl, sum, 0);
    for (int l = 0; l < nl; l++) {
        QB_UNROLL
        for (int h = 0; h < 2; h++) s[l].l[h] = QB_ADD(QB_MUL(s[l].l[h], f[l][h]), sum[l][h]);
        QB_UNROLL
        for (int nt = 0; nt < AF_DW / 8; nt++) {
            if (nt * 8 >= dw) continue;
            s[l].o[nt][0] = QB_MUL(s[l].o[nt][0], f[l][0]);
            s[l].o[nt][1] = QB_MUL(s[l].o[nt][1], f[l][0]);
            s[l].o[nt][2] = QB_MUL(s[l].o[nt][2], f[l][1]);
            s[l].o[nt][3] = QB_MUL(s[l].o[nt][3], f[l][1]);
        }
    }
    /* O += P V: V as the B operand (rows = keys 2t, 2t + 1 and 2t + 8, 2t + 9 of column g) */
    QB_UNROLL
    for (int j = 0; j < 2; j++)
        QB_UNROLL
        for (int nt = 0; nt < AF_DW / 8; nt++) {
            if (nt * 8 >= dw) continue;
            uint32_t bv[AF_NL][2];
            for (int l = 0; l < nl; l++) {
                const int g = (lane0 + l) >> 2, t = (lane0 + l) & 3, col = d0 + nt * 8 + g, k = 16 * j + 2 * t;
                bv[l][0] = (uint32_t)V[k * rs + col] | (uint32_t)V[(k + 1) * rs + col] << 16;
                bv[l][1] = (uint32_t)V[(k + 8) * rs + col] | (uint32_t)V[(k + 9) * rs + col] << 16;
            }
            af_mma(nl, &s[0].o[nt][0], (int)(sizeof(af_lane) / sizeof(float)), &pa[0][j][0], 8, &bv[0][0], 2);
        }
}

/* A lane's rows g, g + 8 of head h written out: O / l (0 where nothing was seen, NaN kept). */
QB_HD void af_write(const af_lane *s, int lane, float *out, int64_t n_q, int n_head, int h, int D, int d0, int dw,
                    int64_t row0)
{
    const int g = lane >> 2, t = lane & 3;
    QB_UNROLL
    for (int half = 0; half < 2; half++) {
        const int64_t row = row0 + g + 8 * half;
        if (row >= n_q) continue;
        const float L = s->l[half];
        const int live = L > 0.0f || L != L;
        QB_UNROLL
        for (int nt = 0; nt < AF_DW / 8; nt++) {
            if (nt * 8 >= dw) continue;
            QB_UNROLL
            for (int e = 0; e < 2; e++)
                out[(row * n_head + h) * (int64_t)D + d0 + nt * 8 + 2 * t + e] =
                    live ? QB_DIV(s->o[nt][half * 2 + e], L) : 0.0f;
        }
    }
}

/* A lane's rows g, g + 8 of head h as split z's partial (ag_combine_one's layout: row r = t * n_head
 * + h has its maximum and sum at part_ml[(r * n_split + z) * 2 ..] and its unnormalised output at
 * part_o[(r * n_split + z) * D ..]). */
QB_HD void af_write_part(const af_lane *s, int lane, float *part_o, float *part_ml, int64_t n_q, int n_head, int h,
                         int D, int d0, int dw, int64_t row0, int n_split, int z)
{
    const int g = lane >> 2, t = lane & 3;
    QB_UNROLL
    for (int half = 0; half < 2; half++) {
        const int64_t row = row0 + g + 8 * half;
        if (row >= n_q) continue;
        const int64_t pr = (row * n_head + h) * n_split + z;
        /* a NaN score left the maximum alone (fmaxf) and the sum NaN: the maximum says NaN too, or
         * the merge would skip this split as one that saw nothing */
        if (t == 0 && d0 == 0) {
            const float L = s->l[half];
            part_ml[pr * 2] = L != L ? L : s->m[half];
            part_ml[pr * 2 + 1] = L;
        }
        QB_UNROLL
        for (int nt = 0; nt < AF_DW / 8; nt++) {
            if (nt * 8 >= dw) continue;
            QB_UNROLL
            for (int e = 0; e < 2; e++) part_o[pr * D + d0 + nt * 8 + 2 * t + e] = s->o[nt][half * 2 + e];
        }
    }
}

/* The smallest and largest position of the block's rows row0 .. row0 + n (those below n_q). */
QB_HD void af_row_span(const int32_t *q_pos, int64_t n_q, int64_t row0, int n, int32_t *minp, int32_t *maxp)
{
    *minp = INT32_MAX;
    *maxp = INT32_MIN;
    for (int64_t r = row0; r < row0 + n && r < n_q; r++) {
        if (q_pos[r] < *minp) *minp = q_pos[r];
        if (q_pos[r] > *maxp) *maxp = q_pos[r];
    }
}

#ifndef __CUDA_ARCH__
/* Attention a (n_cur 0) as the kernel computes it with n_split splits, every warp of every block
 * on the host; the blocks: (ceil(n_q / (rt * 16)) row groups) x (KV heads x head batches) x splits. */
static inline void af_attention_sim(const be_attn *a, int n_split, float *out)
{
    const int D = a->head_dim, group = a->n_head / a->n_head_kv, nhb = ag_head_batches(group);
    const af_shape sh = af_shape_of(D, group);
    unsigned char *mem = (unsigned char *)malloc(af_smem_bytes(D, sh));
    af_lane *lanes = (af_lane *)malloc(sizeof(af_lane) * 32 * (size_t)sh.warps);
    ag_page *pages;
    uint64_t *masks;
    const int has_bias = ag_pages_of(a, &pages, &masks);
    const size_t n_part = (size_t)a->n_q * (size_t)a->n_head * (size_t)n_split;
    float *po = (float *)malloc(sizeof(float) * n_part * (size_t)D), *pml = (float *)malloc(sizeof(float) * n_part * 2);
    if (!mem || !lanes || !po || !pml) abort();
    const af_smem m = af_smem_at(mem, D, sh);
    const int64_t rows = (int64_t)sh.rt * 16;
    for (int64_t row0 = 0; row0 < a->n_q; row0 += rows)
        for (int gbz = 0; gbz < a->n_head_kv * nhb * n_split; gbz++) {
            const int gb = gbz / n_split, z = gbz % n_split;
            const int g = gb / nhb, bt = gb % nhb, h0 = g * group + bt * AG_HEADS;
            const int hb_b = ag_batch_heads(group, bt);
            af_fill_q(m, a->q, a->n_q, a->n_head, D, sh, row0, h0, hb_b, 0, 1);
            int32_t minp, maxp;
            af_row_span(a->q_pos, a->n_q, row0, (int)rows, &minp, &maxp);
            int32_t qp[8][32][2], wmax[8];
            for (int wi = 0; wi < sh.warps; wi++) {
                const int rt = wi / (sh.hb * sh.ds);
                int32_t lo;
                af_row_span(a->q_pos, a->n_q, row0 + rt * 16, 16, &lo, &wmax[wi]);
                for (int l = 0; l < 32; l++) {
                    af_lane_init(&lanes[wi * 32 + l]);
                    for (int h = 0; h < 2; h++) {
                        const int64_t r = row0 + rt * 16 + (l >> 2) + 8 * h;
                        qp[wi][l][h] = r < a->n_q ? a->q_pos[r] : INT32_MIN;
                    }
                }
            }
            int64_t p0, p1;
            ag_split_range(a->head_pages, a->n_pages, g, n_split, z, &p0, &p1);
            for (af_cursor c = af_settle(pages, p0, 0, p1, minp, maxp, a->window); c.ip < p1;
                 c = af_settle(pages, c.ip, c.r0 + AF_KT, p1, minp, maxp, a->window)) {
                af_load_tile(m.s0, &pages[c.ip], c.r0, masks, g, D, 0, 1);
                for (int wi = 0; wi < sh.warps; wi++) {
                    const int rt = wi / (sh.hb * sh.ds), hh = (wi / sh.ds) % sh.hb, ds = wi % sh.ds;
                    if (hh >= hb_b || m.s0.pos[0] > wmax[wi]) continue;   /* no head, or a tile past every row */
                    const size_t qoff = (size_t)(rt * sh.hb + hh) * 16 * (size_t)(D + AF_PAD);
                    af_warp_tile(m.s0, m.qh + qoff, m.ql + qoff, D, ds * sh.dw, sh.dw, a->window, has_bias,
                                 (const int32_t(*)[2])qp[wi], 0, 32, &lanes[wi * 32]);
                }
            }
            for (int wi = 0; wi < sh.warps; wi++) {
                const int rt = wi / (sh.hb * sh.ds), hh = (wi / sh.ds) % sh.hb, ds = wi % sh.ds;
                if (hh >= hb_b) continue;
                for (int l = 0; l < 32; l++) {
                    if (n_split == 1)
                        af_write(&lanes[wi * 32 + l], l, out, a->n_q, a->n_head, h0 + hh, D, ds * sh.dw, sh.dw,
                                 row0 + rt * 16);
                    else
                        af_write_part(&lanes[wi * 32 + l], l, po, pml, a->n_q, a->n_head, h0 + hh, D, ds * sh.dw,
                                      sh.dw, row0 + rt * 16, n_split, z);
                }
            }
        }
    if (n_split > 1) ag_combine_all(po, pml, a->n_q * a->n_head, n_split, D, out);
    free(po);
    free(pml);
    free(mem);
    free(lanes);
    free(pages);
    free(masks);
}
#endif

#endif
