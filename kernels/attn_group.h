/* attn_group.h - grouped paged attention's per-lane work, one header for C and CUDA (issue 25, stage 3).
 *
 * Attention over the KV pages is bound by the bytes of the keys and values it reads. Here a block
 * of AG_THREADS threads serves every query head of one KV head (a GQA group, in batches of
 * AG_HEADS), so each page is read once per group rather than once per query head, and one slice of
 * that head's pages (the splits give a decode step enough blocks to fill the device; ag_combine_one
 * below merges them, for every attention kernel of the backend):
 * - The block stages its pages' descriptors in shared memory, AG_PCHUNK at a time (ag_stage), so
 *   that no row's load waits for its page's descriptor to arrive from memory.
 * - A key row is shared by `lk` lanes (a "slot"), each holding AG_DL consecutive dimensions: one
 *   16-byte load of f16 for the key and one for the value. A block has AG_THREADS / lk slots; in
 *   each page slot s takes rows s, s + slots, ..., `rows` of them a round (ag_slot_run), all
 *   fetched before any is used: a lane waits for memory once a round, not three times a row.
 * - Each lane multiplies its dimensions by the block's query heads, the slot's lanes add their
 *   shares by a butterfly of shuffles (ag_slot_sum), and every lane of the slot updates its own
 *   online softmax (running maximum, sum and output, per head) with the same score.
 * - At the end the slots' states merge (ag_merge): within a warp by shuffles, then the warps in
 *   order through shared memory; each block leaves its split's maximum, sum and unnormalised
 *   output, and ag_combine_one merges the splits.
 * The kernels in kernels/cuda/attn_rows.cu run these functions; ag_block_sim and ag_attention_sim
 * run them for every lane on the host (tests/test_attn_kernels.c checks them against the CPU backend
 * and against double precision). Every float operation is written out (QB_MUL, QB_ADD, fmaf) and
 * the exponential is ag_exp, not the device's approximate one, so the device gives the host's bits. */
#ifndef KVCHAT_ATTN_GROUP_H
#define KVCHAT_ATTN_GROUP_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/exp_poly.h"
#include "kernels/quant_blocks.h"

#define AG_THREADS 128   /* threads a block */
#define AG_HEADS 4       /* query heads a block serves at most (a larger group takes several blocks) */
#define AG_DL 8          /* dimensions a lane holds: 16 bytes of f16 */
#define AG_MAX_D 256     /* head dimensions up to 32 lanes of AG_DL */
#define AG_PCHUNK 32     /* page descriptors a block stages at a time */
#define AG_MAX_ROWS 8    /* rows a slot fetches a round, at most */
#define AG_ROWS 4        /* ... by default (KVCHAT_CUDA_ATTN_ROWS): a 7B page's rows in one round */

/* Blocks a multiprocessor holds of the grouped kernel fetching `rows` rows a round: its launch
 * bounds, and what a call's splits are counted against (call_splits) so that they fill the device
 * in one wave. */
#define AG_MIN_BLOCKS(rows) ((rows) <= 4 ? 3 : 2)

#ifdef __CUDA_ARCH__
#define AG_NL 1          /* lanes one call of ag_slot_run works for: the thread's own */
#else
#define AG_NL 32         /* every lane of a slot, simulated */
#endif

/* One page as the kernels read it: n rows whose f16 key and value rows of KV head g start at
 * k + i * stride + g * head_step (v likewise); the token mask's words start at masks[mask_off]
 * (-1: every token attended). */
typedef struct ag_page {
    const uint16_t *k, *v;
    const int32_t *pos;
    const float *bias;        /* NULL: none */
    int64_t mask_off;
    int32_t n, stride, head_step;
} ag_page;

/* The page lists one launch reads: one that every query reads (n 1), or one a query (n > 1: query
 * t reads l[t], a batch's sequence each, be_attn_seqs_joined). Each list has the split count its
 * call alone would get, so that its query gets that call's bits; a row's partials lie `stride`
 * splits apart (the most of any list's), and a block past its list's splits does nothing. */
#define AG_MAX_LISTS BE_ATTN_SEQS_MAX
typedef struct ag_list {
    const ag_page *pages;
    const int64_t *head_pages;   /* NULL: every KV head reads all n_pages */
    const uint64_t *masks;
    int64_t n_pages;
    int32_t n_split;
} ag_list;

typedef struct ag_lists {
    ag_list l[AG_MAX_LISTS];
    int32_t n, stride;
} ag_lists;

/* Query t's list (a kernel takes the lists as a __grid_constant__ parameter, so that this indexes
 * the parameter where it is instead of copying it to the stack). */
QB_HD ag_list ag_list_of(const ag_lists *L, int64_t t) { return L->l[L->n > 1 ? t : 0]; }

/* One lane's online softmax: per head, the running maximum, sum and output of its dimensions. */
typedef struct ag_state {
    float m[AG_HEADS], l[AG_HEADS];
    float o[AG_HEADS][AG_DL];
} ag_state;

/* Head dimensions these kernels take: whole 16-byte loads, at most 32 lanes a key. */
QB_HD int ag_supported(int D) { return D > 0 && D % AG_DL == 0 && D <= AG_MAX_D; }

/* Lanes a key row takes: D / AG_DL rounded up to a power of two (a slot never straddles a warp);
 * lanes past D / AG_DL hold nothing. */
QB_HD int ag_lanes_per_key(int D)
{
    int lk = 1;
    while (lk * AG_DL < D) lk <<= 1;
    return lk;
}

/* e^x, the same bits on the host and the device (kernels/exp_poly.h, the CPU backend's too): e^0
 * is 1 exactly, NaN stays NaN. */
QB_HD float ag_exp(float x) { return xp_exp(x); }

QB_HD void ag_state_init(ag_state *s)
{
    for (int h = 0; h < AG_HEADS; h++) {
        s->m[h] = -INFINITY;
        s->l[h] = 0.0f;
        for (int j = 0; j < AG_DL; j++) s->o[h][j] = 0.0f;
    }
}

/* Merge (m2, l2, o2) into (m, l, o): both rescaled to the larger maximum. Symmetric in its two
 * operands (products, then one sum), so the two lanes of a butterfly get the same bits. */
QB_HD void ag_merge(float *m, float *l, float *o, float m2, float l2, const float *o2)
{
    const float M = m2 > *m ? m2 : *m;
    const float c1 = *m == -INFINITY ? 0.0f : ag_exp(QB_SUB(*m, M));
    const float c2 = m2 == -INFINITY ? 0.0f : ag_exp(QB_SUB(m2, M));
    *m = M;
    *l = QB_ADD(QB_MUL(*l, c1), QB_MUL(l2, c2));
    for (int j = 0; j < AG_DL; j++) o[j] = QB_ADD(QB_MUL(o[j], c1), QB_MUL(o2[j], c2));
}

/* A selection of a KV head's list (be_attn.sel_best): entry j of the selected list is entry
 * ag_sel_at(...) of the head's own, the n_best chosen (ascending, below from) first, then every
 * entry from `from` on. */
QB_HD int64_t ag_sel_at(const int32_t *best, int32_t n_best, int64_t from, int64_t j)
{
    return j < n_best ? (int64_t)best[j] : from + (j - n_best);
}

/* The splits a call of `blocks` blocks a split gets: as many as the device holds at once (per_sm
 * blocks on each of n_sm multiprocessors) with none left for a second wave, at least 1 and at most
 * `most` (a page each of the longest head's). A few blocks past a wave cost as long as a whole
 * wave: rounded up, 8 KV heads at 3 blocks on the H200's 132 took 50 splits, 400 blocks for 396
 * places (at 32K the last split of each head was empty, ag_split_range's rounding; from 64K on it
 * is not). */
QB_HD int ag_call_splits(int per_sm, int n_sm, int64_t blocks, int64_t most)
{
    const int64_t want = blocks > 0 ? (int64_t)per_sm * n_sm / blocks : 1;
    return (int)(want < 1 ? 1 : want > most ? (most > 0 ? most : 1) : want);
}

/* Pages [*p0, *p1) of KV head g's list that split z of n_split takes (head_pages as in be_attn). */
QB_HD void ag_split_range(const int64_t *head_pages, int64_t n_pages, int g, int n_split, int z, int64_t *p0,
                          int64_t *p1)
{
    const int64_t h0 = head_pages ? head_pages[g] : 0, h1 = head_pages ? head_pages[g + 1] : n_pages;
    const int64_t per = (h1 - h0 + n_split - 1) / n_split, a = h0 + (int64_t)z * per;
    *p0 = a < h1 ? a : h1;
    *p1 = a + per < h1 ? a + per : h1;
}

/* Page *src as a block stages it for a query at qp (into shared memory on the device): as it is,
 * but with n 0 when none of its rows can be seen (none, or its first position past qp: positions
 * ascend within a page), so that no row of it is read. */
QB_HD ag_page ag_stage(const ag_page *src, int32_t qp)
{
    ag_page pg = *src;
    if (pg.n > 0 && pg.pos[0] > qp) pg.n = 0;
    return pg;
}

/* Row i of a page of n rows, at position kp and with mask word mw (bit i & 63; all ones without a
 * mask), is seen by a query at qp (causal, sliding window, token mask). */
QB_HD int ag_row_seen(int32_t i, int32_t n, int32_t kp, uint64_t mw, int32_t qp, int32_t window)
{
    if (i >= n || kp > qp || (window > 0 && qp - kp >= window)) return 0;
    return (int)((mw >> (i & 63)) & 1u);
}

/* A read of a page's rows (keys, values, positions, masks, bias): on the device through the
 * read-only path, as nothing writes them while a kernel reads them. */
#ifdef __CUDA_ARCH__
#define AG_READ(p) __ldg(p)
#else
#define AG_READ(p) (*(p))
#endif

/* A lane's 16 bytes of a key or value row. */
QB_HD void ag_load16(const uint16_t *p, uint32_t *u)
{
#ifdef __CUDA_ARCH__
    const uint4 v = __ldg((const uint4 *)p);
    u[0] = v.x;
    u[1] = v.y;
    u[2] = v.z;
    u[3] = v.w;
#else
    qb_load16(p, u);
#endif
}

QB_HD void ag_unpack(const uint32_t *u, float *f)
{
    for (int j = 0; j < 4; j++) {
        f[2 * j] = qb_half(u[j] & 0xFFFFu);
        f[2 * j + 1] = qb_half(u[j] >> 16);
    }
}

/* The scores of the slot's lanes, summed over its lk lanes for each of hb heads: on the device by
 * shuffles within the slot (every lane of the warp takes part), on the host over the nl = lk lanes
 * given, in the same butterfly (lane l adds lane l ^ o's value, o = lk / 2 .. 1). */
QB_HD void ag_slot_sum(float (*part)[AG_HEADS], int nl, int lk, int hb)
{
#ifdef __CUDA_ARCH__
    (void)nl;
    /* unrolled, the stages below lk taken (the same for the whole block), each stage's heads side
     * by side: their shuffles in flight together, each head's sums in the loop's order */
    QB_UNROLL
    for (int o = 16; o > 0; o >>= 1) {
        if (o >= lk) continue;
        QB_UNROLL
        for (int h = 0; h < AG_HEADS; h++)
            if (h < hb) part[0][h] = QB_ADD(part[0][h], __shfl_xor_sync(0xffffffffu, part[0][h], o));
    }
#else
    for (int h = 0; h < hb; h++)
        for (int o = lk >> 1; o > 0; o >>= 1) {
            float w[AG_NL];
            for (int l = 0; l < nl; l++) w[l] = QB_ADD(part[l][h], part[l ^ o][h]);
            for (int l = 0; l < nl; l++) part[l][h] = w[l];
        }
#endif
}

/* A key's scores (already summed, the same bits on every lane of the slot) folded into a lane's
 * state and value row in three steps, each head as one step would: ag_rescale (a new maximum: what
 * came before rescaled to it), ag_weights (each head's weight e^(s - m)), ag_accumulate (the sum
 * and the value row weighted). Apart so that the weights, which every lane of a slot would compute
 * alike, are computed once a slot on the device: by lanes 0 .. hb - 1 of the slot, one head each,
 * and passed to the others by shuffles. */
QB_HD void ag_rescale(ag_state *st, const float *score, int hb)
{
    QB_UNROLL
    for (int h = 0; h < AG_HEADS; h++) {
        if (h >= hb) continue;
        const float s = score[h];
        if (s == -INFINITY) continue;   /* weighs nothing */
        if (s > st->m[h] || s != s) {   /* a NaN spreads */
            const float c = st->m[h] == -INFINITY ? 0.0f : ag_exp(QB_SUB(st->m[h], s));
            st->l[h] = QB_MUL(st->l[h], c);
            for (int j = 0; j < AG_DL; j++) st->o[h][j] = QB_MUL(st->o[h][j], c);
            st->m[h] = s;
        }
    }
}

/* w[h] = e^(score[h] - m[h]) for the slot's heads, of a row that is `seen` (else nothing that is
 * read). On the device every lane of the warp must call it (it shuffles); `ls` is the lane's place
 * in its slot of lk lanes. Where a slot has fewer lanes than heads (head dimensions of 16 and
 * less), each lane computes every head's. */
QB_HD void ag_weights(const ag_state *st, const float *score, int hb, int lk, int ls, int seen, float *w)
{
#ifdef __CUDA_ARCH__
    if (lk >= AG_HEADS) {   /* the same for the whole block */
        const int mine = ls < hb ? ls : 0;
        float s = score[0], m = st->m[0];
        QB_UNROLL
        for (int h = 1; h < AG_HEADS; h++)   /* selected, not indexed: registers stay registers */
            if (h == mine) s = score[h], m = st->m[h];
        const float own = ag_exp(QB_SUB(s, m));
        QB_UNROLL
        for (int h = 0; h < AG_HEADS; h++)
            if (h < hb) w[h] = __shfl_sync(0xffffffffu, own, h, lk);   /* lane h of the slot */
        return;
    }
#else
    (void)lk, (void)ls;
#endif
    if (!seen) return;
    QB_UNROLL
    for (int h = 0; h < AG_HEADS; h++)
        if (h < hb) w[h] = ag_exp(QB_SUB(score[h], st->m[h]));
}

QB_HD void ag_accumulate(ag_state *st, const float *score, const float *w, const uint32_t *vraw, int hb)
{
    float v[AG_DL];
    ag_unpack(vraw, v);
    QB_UNROLL
    for (int h = 0; h < AG_HEADS; h++) {
        if (h >= hb || score[h] == -INFINITY) continue;
        st->l[h] = QB_ADD(st->l[h], w[h]);
        for (int j = 0; j < AG_DL; j++) st->o[h][j] = fmaf(w[h], v[j], st->o[h][j]);
    }
}

/* The first use of a round's fetches made to wait for every one of them: what they loaded XOR'ed
 * into the first key row's first word under `hold`, a zero that comes from the launch, so that the
 * compiler cannot know it is zero and ptxas cannot schedule a use ahead of a later row's loads.
 * Left to itself it did, in some instances: row 0's loads issued, unpacked and used, and only then
 * the other rows' (scripts/check_sass_loads.sh). Bits unchanged: hold is zero. */
QB_HD void ag_hold_for_every_fetch(uint32_t hold, const uint32_t (*kr)[AG_MAX_ROWS][4],
                                   const uint32_t (*vr)[AG_MAX_ROWS][4], const int32_t *kp, const uint64_t *mw,
                                   const float *bias, int rows, uint32_t *first)
{
    uint32_t all = 0;   /* by XOR, which no operand absorbs (an OR with a mask of all ones would) */
    QB_UNROLL
    for (int u = 0; u < AG_MAX_ROWS; u++) {
        if (u >= rows) continue;
        for (int w = 0; w < 4; w++) all ^= kr[0][u][w] ^ vr[0][u][w];
        uint32_t b;
        memcpy(&b, &bias[u], sizeof b);
        all ^= (uint32_t)kp[u] ^ (uint32_t)mw[u] ^ (uint32_t)(mw[u] >> 32) ^ b;
    }
    *first ^= all & hold;
}

/* Slot `slot` of `slots` over the n_pages staged pages (ag_stage) of KV head g for a query at qp:
 * lanes lane0 .. lane0 + nl of the slot (the device: its own lane, nl = 1; the host: all lk), each
 * with its query dimensions q[l][h][..] (AG_DL of head h, zero past D) and its state st[l]. A round
 * takes `rows` rows of a page (1 to AG_MAX_ROWS: s, s + slots, ...): every row's key and value
 * dimensions, position, mask word and bias are fetched before any is used, so a lane waits one
 * round trip a round rather than one for each of them a row. A row past the page's end fetches its
 * last row again and is not seen, and a lane past D fetches its row's first dimensions and scores
 * zero (its output is never written), so that no load waits behind a branch or a select. Every
 * row is used in slot order whatever `rows` is: the same bits for any (at a given split count).
 * hold: 0, from the launch (ag_hold_for_every_fetch). The loops over pages, rounds and rows are
 * the same for every lane of a block, so every lane reaches every shuffle. */
QB_HD void ag_slot_run(const ag_page *pages, int64_t n_pages, const uint64_t *masks, int g, int32_t qp,
                       int32_t window, int slot, int slots, int lk, int lane0, int nl, int D, int hb, int rows,
                       uint32_t hold, const float (*q)[AG_HEADS][AG_DL], ag_state *st)
{
    for (int64_t ip = 0; ip < n_pages; ip++) {
        const ag_page pg = pages[ip];
        if (pg.n <= 0) continue;
        const uint16_t *kb = pg.k + (int64_t)g * pg.head_step, *vb = pg.v + (int64_t)g * pg.head_step;
        for (int32_t r = 0; r < pg.n; r += rows * slots) {
            uint32_t kr[AG_NL][AG_MAX_ROWS][4], vr[AG_NL][AG_MAX_ROWS][4];
            int32_t kp[AG_MAX_ROWS];
            uint64_t mw[AG_MAX_ROWS];
            float bias[AG_MAX_ROWS];
            QB_UNROLL
            for (int u = 0; u < AG_MAX_ROWS; u++) {   /* the fetches: the rows' keys and values first */
                if (u >= rows) continue;
                const int32_t i = r + slot + u * slots, ic = i < pg.n ? i : pg.n - 1;
                for (int l = 0; l < nl; l++) {
                    const int d0 = (lane0 + l) * AG_DL, dc = d0 < D ? d0 : 0;
                    ag_load16(kb + (int64_t)ic * pg.stride + dc, kr[l][u]);
                    ag_load16(vb + (int64_t)ic * pg.stride + dc, vr[l][u]);
                }
            }
            QB_UNROLL
            for (int u = 0; u < AG_MAX_ROWS; u++) {
                if (u >= rows) continue;
                const int32_t i = r + slot + u * slots, ic = i < pg.n ? i : pg.n - 1;
                kp[u] = AG_READ(&pg.pos[ic]);
                mw[u] = pg.mask_off < 0 ? ~(uint64_t)0 : AG_READ(&masks[pg.mask_off + (ic >> 6)]);
                bias[u] = pg.bias ? AG_READ(&pg.bias[ic]) : 0.0f;
            }
            ag_hold_for_every_fetch(hold, (const uint32_t(*)[AG_MAX_ROWS][4])kr,
                                    (const uint32_t(*)[AG_MAX_ROWS][4])vr, kp, mw, bias, rows, &kr[0][0][0]);
            QB_UNROLL
            for (int u = 0; u < AG_MAX_ROWS; u++) {   /* the uses, in row order */
                /* a round's rows past the page's end on every slot (the same for the whole block;
                 * never its first, which the round's start r < n keeps on the page) */
                if (u >= rows || (u > 0 && r + u * slots >= pg.n)) continue;
                const int32_t i = r + slot + u * slots;
                float part[AG_NL][AG_HEADS];
                for (int l = 0; l < nl; l++) {
                    float k[AG_DL];
                    ag_unpack(kr[l][u], k);
                    if ((lane0 + l) * AG_DL >= D)   /* a lane past D: its score 0 whatever it read */
                        for (int j = 0; j < AG_DL; j++) k[j] = 0.0f;
                    QB_UNROLL
                    for (int h = 0; h < AG_HEADS; h++) {
                        float a = QB_MUL(q[l][h][0], k[0]);
                        for (int j = 1; j < AG_DL; j++) a = fmaf(q[l][h][j], k[j], a);
                        part[l][h] = a;
                    }
                }
                ag_slot_sum(part, nl, lk, hb);
                const int seen = ag_row_seen(i, pg.n, kp[u], mw[u], qp, window);
                for (int l = 0; l < nl; l++) {
                    float s[AG_HEADS], w[AG_HEADS];
                    for (int h = 0; h < AG_HEADS; h++) s[h] = pg.bias ? QB_ADD(part[l][h], bias[u]) : part[l][h];
                    if (seen) ag_rescale(&st[l], s, hb);
                    ag_weights(&st[l], s, hb, lk, lane0 + l, seen, w);   /* every lane: it shuffles */
                    if (seen) ag_accumulate(&st[l], s, w, vr[l][u], hb);
                }
            }
        }
    }
}

/* A merged element from its row's sum L and unnormalised output o: 0 where nothing was visible, NaN
 * where a NaN came in. */
QB_HD float ag_combine_out(float L, float o) { return L > 0.0f || L != L ? QB_DIV(o, L) : 0.0f; }

/* The combined output element d of row r (query t, head h: r = t * n_head + h) from its n_split
 * partials (part_ml[(r * stride + z) * 2 ..] maximum and sum, part_o[(r * stride + z) * D ..]
 * unnormalised output), in split order; 0 where nothing was visible, NaN where a NaN came in. */
QB_HD float ag_combine_one(const float *part_o, const float *part_ml, int64_t r, int stride, int n_split, int D,
                           int d)
{
    const int64_t r0 = r * stride;
    float M = -INFINITY;
    for (int z = 0; z < n_split; z++)
        if (part_ml[(r0 + z) * 2] > M) M = part_ml[(r0 + z) * 2];
    float L = 0.0f, o = 0.0f;
    for (int z = 0; z < n_split; z++) {
        const float m = part_ml[(r0 + z) * 2];
        if (m == -INFINITY) continue;
        const float f = ag_exp(QB_SUB(m, M));
        L = QB_ADD(L, QB_MUL(part_ml[(r0 + z) * 2 + 1], f));
        o = QB_ADD(o, QB_MUL(part_o[(r0 + z) * D + d], f));
    }
    return ag_combine_out(L, o);
}

/* The combine kernel's way to the same bits (ag_combine_tiled below runs it on the host). Each
 * split's maximum, sum and exponential are independent of the others', so a block computes them
 * side by side, a tile of AG_CTILE splits at a time into shared memory (the largest maximum first,
 * by a reduction: a maximum is the same in any order); only the sums need split order, and those
 * read each split's output with AG_CLOADS loads in flight, not one load's latency a split (a
 * decode step of the default model's shape has 256 splits at 8K, which took the serial merge
 * about 0.1 ms). */
#define AG_CTILE 256   /* splits a tile */
#define AG_CLOADS 8    /* partial outputs in flight a thread */

/* The larger of a running maximum and a split's (a NaN never is: as ag_combine_one compares). */
QB_HD float ag_combine_max(float M, float m) { return m > M ? m : M; }

/* Split z's weight in the merge under the largest maximum M: *skip 1 for a split that saw nothing
 * (maximum -inf; it adds nothing), else its exponential. */
QB_HD float ag_combine_weight(float m, float M, unsigned char *skip)
{
    *skip = m == -INFINITY;
    return *skip ? 0.0f : ag_exp(QB_SUB(m, M));
}

/* A tile's nt splits added into *L and *o in split order: split j's sum l[j] and output po[j * D]
 * (element d's, po pointing at the tile's first) under weight f[j]. */
QB_HD void ag_combine_tile(const float *f, const float *l, const unsigned char *skip, int nt, const float *po,
                           int D, float *L, float *o)
{
    for (int j = 0; j < nt; j += AG_CLOADS) {
        float v[AG_CLOADS];
        QB_UNROLL
        for (int k = 0; k < AG_CLOADS; k++) v[k] = j + k < nt ? po[(int64_t)(j + k) * D] : 0.0f;
        QB_UNROLL
        for (int k = 0; k < AG_CLOADS; k++) {
            if (j + k >= nt || skip[j + k]) continue;
            *L = QB_ADD(*L, QB_MUL(l[j + k], f[j + k]));
            *o = QB_ADD(*o, QB_MUL(v[k], f[j + k]));
        }
    }
}

#ifndef __CUDA_ARCH__
/* ag_combine_one as the combine kernel computes it: the largest maximum by threads each over every
 * nth split (nth = the block's threads) merged pairwise, then tile by tile the weights and the sums
 * in split order. Gives ag_combine_one's bits (tests/test_attn_kernels.c). */
static inline float ag_combine_tiled(const float *part_o, const float *part_ml, int64_t r, int stride, int n_split,
                                     int D, int d, int nth)
{
    const int64_t r0 = r * stride;
    float part[256];
    nth = nth < 1 ? 1 : nth > 256 ? 256 : nth;
    for (int t = 0; t < nth; t++) {
        part[t] = -INFINITY;
        for (int z = t; z < n_split; z += nth) part[t] = ag_combine_max(part[t], part_ml[(r0 + z) * 2]);
    }
    for (int w = 1; w < nth; w <<= 1)   /* a tree, as shuffles and shared memory meet them */
        for (int t = 0; t + w < nth; t += 2 * w) part[t] = ag_combine_max(part[t], part[t + w]);
    const float M = part[0];
    float L = 0.0f, o = 0.0f;
    float f[AG_CTILE], l[AG_CTILE];
    unsigned char skip[AG_CTILE];
    for (int t0 = 0; t0 < n_split; t0 += AG_CTILE) {
        const int nt = n_split - t0 < AG_CTILE ? n_split - t0 : AG_CTILE;
        for (int j = 0; j < nt; j++) {
            f[j] = ag_combine_weight(part_ml[(r0 + t0 + j) * 2], M, &skip[j]);
            l[j] = part_ml[(r0 + t0 + j) * 2 + 1];
        }
        ag_combine_tile(f, l, skip, nt, part_o + (r0 + t0) * D + d, D, &L, &o);
    }
    return ag_combine_out(L, o);
}
#endif

/* The blocks of a launch: KV heads times batches of AG_HEADS query heads. */
QB_HD int ag_head_batches(int group) { return (group + AG_HEADS - 1) / AG_HEADS; }

/* Query heads in batch bt of a group: AG_HEADS but for a shorter last batch. */
QB_HD int ag_batch_heads(int group, int bt)
{
    return group - bt * AG_HEADS < AG_HEADS ? group - bt * AG_HEADS : AG_HEADS;
}

#ifndef __CUDA_ARCH__
/* a's pages as the kernels read them, from host memory: *pages (n_pages of them) and the token
 * masks copied one after another into *masks (as the backend stages them); free both. Returns 1
 * when some page carries a bias. */
static inline int ag_pages_of(const be_attn *a, ag_page **pages, uint64_t **masks)
{
    size_t n_words = 0, w = 0;
    for (int64_t i = 0; i < a->n_pages; i++)
        if (a->pages[i].mask && a->pages[i].n > 0) n_words += (size_t)(a->pages[i].n + 63) / 64;
    *pages = (ag_page *)malloc(sizeof(ag_page) * (size_t)(a->n_pages > 0 ? a->n_pages : 1));
    *masks = (uint64_t *)malloc(sizeof(uint64_t) * (n_words ? n_words : 1));
    if (!*pages || !*masks) abort();
    int has_bias = 0;
    for (int64_t i = 0; i < a->n_pages; i++) {
        const be_kv_page *pg = &a->pages[i];
        (*pages)[i] = (ag_page){ pg->k, pg->v, pg->pos, pg->bias, -1, pg->n, pg->stride, pg->head_step };
        if (pg->bias && pg->n > 0) has_bias = 1;
        if (pg->mask && pg->n > 0) {
            const size_t nw = (size_t)(pg->n + 63) / 64;
            memcpy(*masks + w, pg->mask, sizeof(uint64_t) * nw);
            (*pages)[i].mask_off = (int64_t)w;
            w += nw;
        }
    }
    return has_bias;
}

/* Every row's splits merged, as the combine kernel merges them: out[r * D + d]. */
static inline void ag_combine_all(const float *po, const float *pml, int64_t n_rows, int n_split, int D, float *out)
{
    for (int64_t r = 0; r < n_rows; r++)
        for (int d = 0; d < D; d++) out[r * D + d] = ag_combine_one(po, pml, r, n_split, n_split, D, d);
}

/* One block (KV head g, its query heads h0 .. h0 + hb, one query at qp whose rows of those heads
 * are q[h * D ..], pages [p0, p1)) run on the host as the device runs it: every slot's lanes, the
 * butterfly of the warp's slots (lane l merges lane l ^ o's state, o = lk .. 16), then warps 1 ..
 * 3 merged into warp 0 in order; `rows` rows a round (ag_slot_run). po[h * D + d] and pml[h * 2 ..]
 * get the partial of head h0 + h. */
static inline void ag_block_sim(const ag_page *pages, const uint64_t *masks, int64_t p0, int64_t p1, int g,
                                const float *q, int D, int hb, int32_t qp, int32_t window, int rows, float *po,
                                float *pml)
{
    const int lk = ag_lanes_per_key(D), slots = AG_THREADS / lk;
    ag_state *st = (ag_state *)malloc(sizeof(ag_state) * AG_THREADS);
    float (*qv)[AG_HEADS][AG_DL] = (float (*)[AG_HEADS][AG_DL])malloc(sizeof(float) * AG_THREADS * AG_HEADS * AG_DL);
    if (!st || !qv) abort();
    for (int t = 0; t < AG_THREADS; t++) {
        ag_state_init(&st[t]);
        for (int h = 0; h < AG_HEADS; h++)
            for (int j = 0; j < AG_DL; j++) {
                const int d = (t % lk) * AG_DL + j;
                qv[t][h][j] = h < hb && d < D ? q[h * D + d] : 0.0f;
            }
    }
    for (int64_t c = p0; c < p1; c += AG_PCHUNK) {   /* the staged chunks, as the device takes them */
        ag_page staged[AG_PCHUNK];
        const int nc = p1 - c < AG_PCHUNK ? (int)(p1 - c) : AG_PCHUNK;
        for (int i = 0; i < nc; i++) staged[i] = ag_stage(&pages[c + i], qp);
        for (int s = 0; s < slots; s++)
            ag_slot_run(staged, nc, masks, g, qp, window, s, slots, lk, 0, lk, D, hb, rows, 0u,
                        (const float (*)[AG_HEADS][AG_DL])(qv + s * lk), st + s * lk);
    }
    for (int w = 0; w < AG_THREADS / 32; w++)
        for (int o = lk; o < 32; o <<= 1) {
            ag_state nw[32];
            for (int l = 0; l < 32; l++) {
                nw[l] = st[w * 32 + l];
                const ag_state *b = &st[w * 32 + (l ^ o)];
                for (int h = 0; h < hb; h++) ag_merge(&nw[l].m[h], &nw[l].l[h], nw[l].o[h], b->m[h], b->l[h], b->o[h]);
            }
            memcpy(&st[w * 32], nw, sizeof nw);
        }
    for (int l = 0; l < lk; l++) {
        for (int w = 1; w < AG_THREADS / 32; w++) {
            const ag_state *b = &st[w * 32 + l];
            for (int h = 0; h < hb; h++) ag_merge(&st[l].m[h], &st[l].l[h], st[l].o[h], b->m[h], b->l[h], b->o[h]);
        }
        for (int h = 0; h < hb; h++)
            for (int j = 0; j < AG_DL; j++)
                if (l * AG_DL + j < D) po[h * D + l * AG_DL + j] = st[l].o[h][j];
    }
    for (int h = 0; h < hb; h++) {
        pml[h * 2] = st[0].m[h];
        pml[h * 2 + 1] = st[0].l[h];
    }
    free(st);
    free(qv);
}

/* Calls a[0 .. n) (n_cur 0; pages with their mask pointers) in one launch, call i's list with
 * n_split[i] splits, as the device computes it (n 1: a's queries read one list; n > 1: joined calls
 * of one query each, be_attn_seqs_joined, their queries and outputs one call's of n queries), `rows`
 * rows a slot's round: out gets the device's bits, query after query (the same for any `rows`). */
static inline void ag_lists_sim(const be_attn *a, int n, const int *n_split, int rows, float *out)
{
    const int D = a->head_dim, H = a->n_head, group = H / a->n_head_kv, nhb = ag_head_batches(group);
    ag_page *pages[AG_MAX_LISTS];
    uint64_t *masks[AG_MAX_LISTS];
    ag_lists L;
    memset(&L, 0, sizeof L);
    L.n = n;
    for (int i = 0; i < n; i++) {
        ag_pages_of(&a[i], &pages[i], &masks[i]);
        L.l[i] = (ag_list){ pages[i], a[i].head_pages, masks[i], a[i].n_pages, n_split[i] };
        if (n_split[i] > L.stride) L.stride = n_split[i];
    }
    const int64_t n_q = n > 1 ? n : a->n_q;
    const size_t n_rows = (size_t)n_q * (size_t)H * (size_t)L.stride;
    float *po = (float *)malloc(sizeof(float) * n_rows * (size_t)D), *pml = (float *)malloc(sizeof(float) * n_rows * 2);
    if (!po || !pml) abort();
    for (int64_t t = 0; t < n_q; t++) {
        const ag_list l = ag_list_of(&L, t);
        for (int g = 0; g < a->n_head_kv; g++)
            for (int b = 0; b < nhb; b++)
                for (int z = 0; z < l.n_split; z++) {
                    const int h0 = g * group + b * AG_HEADS, hb = ag_batch_heads(group, b);
                    int64_t p0, p1;
                    ag_split_range(l.head_pages, l.n_pages, g, l.n_split, z, &p0, &p1);
                    float bpo[AG_HEADS * AG_MAX_D], bpml[AG_HEADS * 2];
                    const float *qt = a->q + ((size_t)t * (size_t)H + (size_t)h0) * (size_t)D;
                    ag_block_sim(l.pages, l.masks, p0, p1, g, qt, D, hb, a->q_pos[t], a->window, rows, bpo, bpml);
                    for (int h = 0; h < hb; h++) {
                        const size_t row = ((size_t)t * (size_t)H + (size_t)(h0 + h)) * (size_t)L.stride + (size_t)z;
                        memcpy(po + row * (size_t)D, bpo + h * D, sizeof(float) * (size_t)D);
                        pml[row * 2] = bpml[h * 2];
                        pml[row * 2 + 1] = bpml[h * 2 + 1];
                    }
                }
        for (int h = 0; h < H; h++)
            for (int d = 0; d < D; d++) {
                const int64_t r = t * H + h;
                out[r * D + d] = ag_combine_one(po, pml, r, L.stride, l.n_split, D, d);
            }
    }
    for (int i = 0; i < n; i++) {
        free(pages[i]);
        free(masks[i]);
    }
    free(po);
    free(pml);
}

/* Attention a (n_cur 0; pages with their mask pointers) with n_split splits as the device computes
 * it: out gets the device's bits. */
static inline void ag_attention_sim(const be_attn *a, int n_split, float *out)
{
    ag_lists_sim(a, 1, &n_split, AG_ROWS, out);
}
#endif

#endif
