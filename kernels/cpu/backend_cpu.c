/* backend_cpu.c - the CPU implementation of the backend op table (kernels/backend.h).
 *
 * Matrix products quantize the activations once per call into the weight type's activation format
 * and run the fused dot kernels of vec_dot.c over row chunks on the thread pool; attention is a
 * tiled online-softmax loop over the pages of the KV cache, read in place (flash-attention style: no
 * n x n score matrix), split over pages for single-token decode. Small element-wise ops run on the calling thread. */
#include "kernels/backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/quant.h"
#include "kernels/cpu/pick.h"
#include "kernels/cpu/threadpool.h"
#include "kernels/cpu/vec_dot.h"
#include "kernels/mass_kernels.h"
#include "kernels/mean_kernels.h"
#include "kernels/segment_kernels.h"

#define MAX_MM 4           /* products per matmul call */
#define ATT_TILE_Q 8       /* queries per attention task */
#define ATT_BLOCK_K 64     /* keys scored per online-softmax step */

typedef struct cpu_impl {
    tp_pool *pool;
    void *act_buf[MAX_MM];       /* quantized activations, one per distinct activation format */
    size_t act_cap[MAX_MM];
    uint8_t *panel_buf;          /* per thread: one packed weight panel (prefill products) */
    size_t panel_cap;
    float *att_part;             /* decode split partials: m, l, acc */
    size_t att_part_cap;
    float *att_scratch;          /* per-thread score rows */
    size_t att_scratch_cap;
    uint16_t *cur16;             /* rows not in the cache yet, rounded to f16: keys, then values */
    size_t cur16_cap;
    be_kv_page *cur_pages;       /* the page lists with those rows added as one more page per KV head */
    size_t cur_pages_cap;
    be_kv_page *sel_pages;       /* a selection by bounds as its list (be_attn.sel_best) */
    size_t sel_pages_cap;
    uint64_t *sel_masks;         /* a choice of tokens' masks (be_attn.sel_bits) */
    size_t sel_masks_cap;
    float *bound_u;              /* the bounds, when the caller does not want them */
    size_t bound_u_cap;
    int64_t *seg_at;             /* a head's segments' lengths, then starts (be_bounds.bits) */
    size_t seg_at_cap;
    uint64_t *seg_heap;          /* a head's ranking */
    size_t seg_heap_cap;
} cpu_impl;

static cpu_impl *impl_of(be_backend *b) { return b->impl; }

static int grow(void **buf, size_t *cap, size_t need)
{
    if (need <= *cap) return 0;
    void *p = NULL;
    size_t sz = need + need / 4 + 4096;
    if (posix_memalign(&p, 64, sz) != 0) return -1;
    free(*buf);
    *buf = p;
    *cap = sz;
    return 0;
}

/* ---------------------------------------------------------------- matmul */

typedef struct mm_job {
    const be_mm *mms;
    int n_mm;
    const void *act[MAX_MM];     /* activation rows for each product */
    size_t act_row[MAX_MM];      /* bytes per activation row */
    vd_dot_fn dot[MAX_MM];
    vd_dot_rows_fn rows[MAX_MM]; /* 8 rows x one token with the panel kernels' bits, or NULL */
    const vd_gemm *gemm[MAX_MM]; /* panel kernels (a task is one panel) or NULL (a task is a row range) */
    int64_t n_tok;
    int64_t rows_per_task[MAX_MM];
    int64_t first_task[MAX_MM + 1];
    uint8_t *panels;             /* per-thread panel scratch */
    size_t panel_stride;
} mm_job;

/* Batches at least this long take the panel kernels: packing a panel costs about what multiplying
 * it by a few tokens does. */
#define GEMM_MIN_TOK 8

typedef struct quant_job {
    uint32_t wtype;
    int gemm;              /* the panel kernels' rows (vd_gemm_quantize_act), else vd_quantize_act's */
    const float *x;
    int64_t n_in;
    void *dst;
    size_t row_bytes;
} quant_job;

static void quant_task(void *ctx, int64_t t, int thread)
{
    quant_job *q = ctx;
    char *dst = (char *)q->dst + (size_t)t * q->row_bytes;
    if (q->gemm)
        vd_gemm_quantize_act(q->wtype, q->x + t * q->n_in, dst, q->n_in);
    else
        vd_quantize_act(q->wtype, q->x + t * q->n_in, dst, q->n_in);
}

static void mm_task(void *ctx, int64_t task, int thread)
{
    mm_job *j = ctx;
    int m = 0;
    while (task >= j->first_task[m + 1]) m++;
    const be_weight *w = j->mms[m].w;
    float *y = j->mms[m].y;
    int64_t r0 = (task - j->first_task[m]) * j->rows_per_task[m];
    int64_t r1 = r0 + j->rows_per_task[m];
    if (r1 > w->n_out) r1 = w->n_out;
    const vd_gemm *g = j->gemm[m];
    if (g) {
        /* one panel: pack its rows once, then multiply it by every token of the batch */
        void *panel = j->panels + (size_t)thread * j->panel_stride;
        g->pack(w->n_in, (const char *)w->data + (size_t)r0 * w->row_bytes, w->row_bytes, (int)(r1 - r0), panel);
        g->mul(w->n_in, panel, (int)(r1 - r0), j->act[m], j->act_row[m], j->n_tok, y + r0, (size_t)w->n_out);
        return;
    }
    const char *act = j->act[m];
    size_t arow = j->act_row[m];
    vd_dot_rows_fn rows = j->rows[m];
    if (rows) {
        /* groups of 8 rows, each token on its own: the panel kernels' bits (decode equals prefill) */
        for (int64_t r = r0; r < r1; r += 8) {
            int nr = (int)(r1 - r < 8 ? r1 - r : 8);
            const void *wr = (const char *)w->data + (size_t)r * w->row_bytes;
            for (int64_t t = 0; t < j->n_tok; t++)
                rows(w->n_in, &y[t * w->n_out + r], wr, w->row_bytes, nr, act + (size_t)t * arow);
        }
        return;
    }
    vd_dot_fn dot = j->dot[m];
    /* Token blocks keep a slice of activations hot in L2 while a weight row stays in L1. */
    const int64_t TB = 64;
    for (int64_t t0 = 0; t0 < j->n_tok; t0 += TB) {
        int64_t t1 = t0 + TB < j->n_tok ? t0 + TB : j->n_tok;
        for (int64_t r = r0; r < r1; r++) {
            const void *wr = (const char *)w->data + (size_t)r * w->row_bytes;
            for (int64_t t = t0; t < t1; t++) dot(w->n_in, &y[t * w->n_out + r], wr, act + (size_t)t * arow);
        }
    }
}

static void cpu_matmul(be_backend *b, const be_mm *mms, int n_mm, const float *x, int64_t n_tok)
{
    cpu_impl *ci = impl_of(b);
    mm_job j;
    memset(&j, 0, sizeof j);
    j.mms = mms;
    j.n_mm = n_mm;
    j.n_tok = n_tok;
    uint32_t fmt_of_slot[MAX_MM];
    int n_slots = 0;
    int64_t n_in = mms[0].w->n_in;
    size_t panel_bytes = 0;
    for (int m = 0; m < n_mm; m++) {
        uint32_t wt = mms[m].w->type;
        const vd_gemm *g = n_tok >= GEMM_MIN_TOK ? vd_get_gemm(wt) : NULL;
        /* the panel kernels' activation rows are a format of their own */
        uint32_t at = vd_act_type(wt) | (g ? 0x10000u : 0u);
        int s = 0;
        while (s < n_slots && fmt_of_slot[s] != at) s++;
        size_t row = g ? vd_gemm_act_row_size(wt, n_in) : vd_act_row_size(wt, n_in);
        if (s == n_slots) {
            fmt_of_slot[n_slots++] = at;
            if (grow(&ci->act_buf[s], &ci->act_cap[s], row * (size_t)n_tok) != 0) abort();
            quant_job q = { wt, g != NULL, x, n_in, ci->act_buf[s], row };
            if (n_tok >= 8)
                tp_run(ci->pool, quant_task, &q, n_tok);
            else
                for (int64_t t = 0; t < n_tok; t++) quant_task(&q, t, 0);
        }
        j.act[m] = ci->act_buf[s];
        j.act_row[m] = row;
        j.dot[m] = vd_get_dot(wt);
        j.rows[m] = vd_get_dot_rows(wt);
        j.gemm[m] = g;
        if (g && g->panel_bytes(n_in) > panel_bytes) panel_bytes = g->panel_bytes(n_in);
    }
    if (panel_bytes) {
        size_t per = (panel_bytes + 63) & ~(size_t)63;
        if (grow((void **)&ci->panel_buf, &ci->panel_cap, per * (size_t)b->n_threads) != 0) abort();
        j.panels = ci->panel_buf;
        j.panel_stride = per;
    }
    /* Enough tasks for load balance, few enough that scheduling is noise. */
    int64_t total_rows = 0;
    for (int m = 0; m < n_mm; m++) total_rows += mms[m].w->n_out;
    int64_t rpt = total_rows / (16 * (int64_t)b->n_threads);
    if (n_tok > 1) rpt = total_rows / (8 * (int64_t)b->n_threads);
    if (rpt < 8) rpt = 8;
    if (rpt > 256) rpt = 256;
    rpt = rpt / 8 * 8;   /* whole groups of 8 rows for the rows kernels */
    j.first_task[0] = 0;
    for (int m = 0; m < n_mm; m++) {
        j.rows_per_task[m] = j.gemm[m] ? j.gemm[m]->rows : rpt;
        j.first_task[m + 1] = j.first_task[m] + (mms[m].w->n_out + j.rows_per_task[m] - 1) / j.rows_per_task[m];
    }
    tp_run(ci->pool, mm_task, &j, j.first_task[n_mm]);
}

/* ---------------------------------------------------------------- element-wise ops */

/* Element-wise ops on a batch split their rows over the pool; a single row runs inline. */
typedef struct rows_job {
    int64_t rows, per;
    void (*fn)(struct rows_job *j, int64_t r0, int64_t r1);
    const float *x, *w;
    float *y;
    const float *up;
    int64_t dim;
    float eps;
    int flag;
    const float *post;
    float *o, *h;
    const be_qk *qk;
} rows_job;

static void rows_task(void *ctx, int64_t t, int thread)
{
    rows_job *j = ctx;
    int64_t r0 = t * j->per, r1 = r0 + j->per < j->rows ? r0 + j->per : j->rows;
    j->fn(j, r0, r1);
}

static void run_rows(be_backend *b, rows_job *j)
{
    int64_t tasks = j->rows >= 16 ? 4 * (int64_t)b->n_threads : 1;
    j->per = (j->rows + tasks - 1) / tasks;
    if (tasks == 1) {
        j->fn(j, 0, j->rows);
        return;
    }
    tp_run(impl_of(b)->pool, rows_task, j, (j->rows + j->per - 1) / j->per);
}

static void rmsnorm_rows(rows_job *j, int64_t r0, int64_t r1)
{
    for (int64_t r = r0; r < r1; r++) vd_rmsnorm_f32(j->dim, j->x + r * j->dim, j->w, j->y + r * j->dim, j->eps);
}

static void cpu_rmsnorm(be_backend *b, const float *x, const float *w, float *y, int64_t rows, int64_t dim,
                        float eps)
{
    rows_job j = { .rows = rows, .fn = rmsnorm_rows, .x = x, .w = w, .y = y, .dim = dim, .eps = eps };
    run_rows(b, &j);
}

/* theta_i = p * base^(-2i/d), built as a running product like the reference implementation. */
static void rope_angles(float pos_scaled, float theta_scale, int half, float *cs, float *sn)
{
    float theta = pos_scaled;
    for (int i = 0; i < half; i++) {
        cs[i] = cosf(theta);
        sn[i] = sinf(theta);
        theta *= theta_scale;
    }
}

/* One head's row of head_dim values normalized (w given), rotated and scaled (s != 1). */
static void qk_row(float *v, int head_dim, const float *w, float eps, const float *cs, const float *sn, int neox,
                   float s)
{
    int half = head_dim / 2;
    if (w) vd_rmsnorm_f32(head_dim, v, w, v, eps);
    for (int i = 0; i < half; i++) {
        int i0 = neox ? i : 2 * i;
        int i1 = neox ? i + half : 2 * i + 1;
        float x0 = v[i0], x1 = v[i1];
        v[i0] = x0 * cs[i] - x1 * sn[i];
        v[i1] = x0 * sn[i] + x1 * cs[i];
    }
    if (s != 1.0f)
        for (int i = 0; i < head_dim; i++) v[i] *= s;
}

static void qk_rows(rows_job *j, int64_t t0, int64_t t1)
{
    const be_qk *r = j->qk;
    int D = r->head_dim;
    float cs[1024], sn[1024];
    float theta_scale = powf(r->freq_base, -2.0f / (float)D);
    for (int64_t t = t0; t < t1; t++) {
        rope_angles((float)r->pos[t] * r->freq_scale, theta_scale, D / 2, cs, sn);
        for (int h = 0; h < r->n_head; h++)
            qk_row(r->q + (t * r->n_head + h) * (int64_t)D, D, r->q_norm, r->eps, cs, sn, r->neox, r->q_scale);
        for (int h = 0; h < r->n_head_kv; h++)
            qk_row(r->k + (t * r->n_head_kv + h) * (int64_t)D, D, r->k_norm, r->eps, cs, sn, r->neox, 1.0f);
    }
}

static void cpu_qk_rope(be_backend *b, const be_qk *r)
{
    rows_job j = { .rows = r->n_tok, .fn = qk_rows, .qk = r };
    run_rows(b, &j);
}

static void glu_rows(rows_job *j, int64_t r0, int64_t r1)
{
    vd_glu_f32((r1 - r0) * j->dim, j->y + r0 * j->dim, j->up + r0 * j->dim, j->flag);
}

static void cpu_glu(be_backend *b, float *gate, const float *up, int64_t n, int gelu)
{
    /* split into rows of 1024 so a batch spreads over the threads */
    int64_t dim = n % 1024 == 0 ? 1024 : n;
    rows_job j = { .rows = n / dim, .fn = glu_rows, .y = gate, .up = up, .dim = dim, .flag = gelu };
    run_rows(b, &j);
}

static void cpu_get_rows(be_backend *b, const be_weight *w, const int32_t *ids, int64_t n, float scale,
                         float *out)
{
    for (int64_t t = 0; t < n; t++) {
        float *o = out + t * w->n_in;
        quant_dequant_row(w->type, (const char *)w->data + (size_t)ids[t] * w->row_bytes, o, w->n_in);
        if (scale != 1.0f)
            for (int64_t i = 0; i < w->n_in; i++) o[i] *= scale;
    }
}

/* ---------------------------------------------------------------- attention */

typedef struct att_job {
    const be_attn *a;
    int group;             /* query heads per KV head */
    int64_t n_tiles;       /* query tiles */
    int n_split;           /* page-range splits (decode) */
    float *part;           /* [n_head][n_split][2 + head_dim] when n_split > 1 */
    float *scratch;        /* per thread: rows of ATT_BLOCK_K scores, then m, l, live, acc */
    size_t scratch_per_thread;
} att_job;

static void head_range(const be_attn *a, int g, int64_t *p0, int64_t *p1)
{
    if (a->head_pages) {
        *p0 = a->head_pages[g];
        *p1 = a->head_pages[g + 1];
    } else {
        *p0 = 0;
        *p1 = a->n_pages;
    }
}

/* One decode tile's keys, gathered across pages (see att_task). */
typedef struct att_keys {
    const uint16_t *k[ATT_BLOCK_K], *v[ATT_BLOCK_K];
    int32_t pos[ATT_BLOCK_K];
    float bias[ATT_BLOCK_K];
    int n;
} att_keys;

/* Scores, online-softmax update and value accumulation of one block of keys for the tile's rows. */
static void att_block(const be_attn *a, int g, int G, int64_t q0, int64_t q1, const att_keys *kb, float *sc, float *m,
                      float *l, float *acc)
{
    const int D = a->head_dim, nk = kb->n, nrows = (int)(q1 - q0) * G;
    const int64_t qstride = (int64_t)a->n_head * D;
    for (int64_t t = q0; t < q1; t++) {
        int32_t qp = a->q_pos[t];
        int r0 = (int)(t - q0) * G;
        const float *qt = a->q + t * qstride + (int64_t)g * G * D;
        int live = 0;
        /* keys outer, heads inner: each key row serves the G query heads while in L1 */
        for (int k = 0; k < nk; k++) {
            if (kb->pos[k] > qp || (a->window > 0 && qp - kb->pos[k] >= a->window)) {
                for (int hh = 0; hh < G; hh++) sc[(size_t)(r0 + hh) * ATT_BLOCK_K + (size_t)k] = -INFINITY;
                continue;
            }
            live = 1;
            for (int hh = 0; hh < G; hh++)
                sc[(size_t)(r0 + hh) * ATT_BLOCK_K + (size_t)k] = vd_dot_f32_f16(D, qt + (int64_t)hh * D, kb->k[k]) + kb->bias[k];
        }
        for (int hh = 0; hh < G; hh++) {
            int r = r0 + hh;
            float *s = sc + (size_t)r * ATT_BLOCK_K;
            if (!live) {
                memset(s, 0, sizeof(float) * (size_t)nk);
                continue;
            }
            float mx = m[r];
            for (int k = 0; k < nk; k++)
                if (s[k] > mx) mx = s[k];
            float corr = expf(m[r] - mx);   /* exp(-inf) = 0 on the first live block */
            float *ac = acc + (size_t)r * D;
            if (corr != 1.0f) {
                l[r] *= corr;
                for (int i = 0; i < D; i++) ac[i] *= corr;
            }
            m[r] = mx;
            for (int k = 0; k < nk; k++) s[k] -= mx;   /* -inf stays -inf, exp gives 0 */
            vd_exp_f32(nk, s, s);
            float lsum = 0;
            for (int k = 0; k < nk; k++) lsum += s[k];
            l[r] += lsum;
        }
    }
    for (int k = 0; k < nk; k++)
        for (int r = 0; r < nrows; r++) {
            float w = sc[(size_t)r * ATT_BLOCK_K + (size_t)k];
            if (w != 0.0f) vd_axpy_f16(D, w, kb->v[k], acc + (size_t)r * D);
        }
}

static void att_task(void *ctx, int64_t task, int thread)
{
    att_job *j = ctx;
    const be_attn *a = j->a;
    int D = a->head_dim;
    int64_t qstride = (int64_t)a->n_head * D;
    int split = (int)(task % j->n_split);
    int64_t rest = task / j->n_split;
    int64_t tile = rest % j->n_tiles;
    int g = (int)(rest / j->n_tiles);
    int64_t q0 = tile * ATT_TILE_Q;
    int64_t q1 = q0 + ATT_TILE_Q < a->n_q ? q0 + ATT_TILE_Q : a->n_q;
    int G = j->group;
    int nrows = (int)(q1 - q0) * G;
    float *sc = j->scratch + (size_t)thread * j->scratch_per_thread;
    float *m = sc + (size_t)nrows * ATT_BLOCK_K;
    float *l = m + nrows;
    float *acc = l + nrows;
    int64_t pg0, pg1;
    head_range(a, g, &pg0, &pg1);
    if (j->n_split > 1) {
        int64_t np = pg1 - pg0;
        int64_t s0 = pg0 + np * split / j->n_split, s1 = pg0 + np * (split + 1) / j->n_split;
        pg0 = s0;
        pg1 = s1;
    }
    for (int r = 0; r < nrows; r++) {
        m[r] = -INFINITY;
        l[r] = 0;
        memset(acc + (size_t)r * D, 0, sizeof(float) * (size_t)D);
    }
    int32_t qmax = INT32_MIN, qmin = INT32_MAX;
    for (int64_t t = q0; t < q1; t++) {
        if (a->q_pos[t] > qmax) qmax = a->q_pos[t];
        if (a->q_pos[t] < qmin) qmin = a->q_pos[t];
    }
    /* The keys some query of the tile can see, gathered across pages into blocks of ATT_BLOCK_K: the
     * blocks (and so the softmax's sums) do not depend on where pages begin and end, and a step's
     * own row attended as a page of its own (a deferred step) gives the bits of the row in its page. */
    att_keys kb;
    kb.n = 0;
    for (int64_t ip = pg0; ip < pg1; ip++) {
        const be_kv_page *pg = &a->pages[ip];
        if (pg->n <= 0 || pg->pos[0] > qmax) continue;   /* positions ascend within a page */
        for (int32_t i = 0; i < pg->n; i++) {
            int32_t kp = pg->pos[i];
            if (kp > qmax) break;
            if (a->window > 0 && kp <= qmin - a->window) continue;
            if (pg->mask && !((pg->mask[i >> 6] >> (i & 63)) & 1u)) continue;
            size_t off = (size_t)i * (size_t)pg->stride + (size_t)g * (size_t)pg->head_step;
            kb.k[kb.n] = pg->k + off;
            kb.v[kb.n] = pg->v + off;
            kb.pos[kb.n] = kp;
            kb.bias[kb.n] = pg->bias ? pg->bias[i] : 0.0f;
            if (++kb.n == ATT_BLOCK_K) {
                att_block(a, g, G, q0, q1, &kb, sc, m, l, acc);
                kb.n = 0;
            }
        }
    }
    if (kb.n) att_block(a, g, G, q0, q1, &kb, sc, m, l, acc);
    for (int64_t t = q0; t < q1; t++) {
        for (int hh = 0; hh < G; hh++) {
            int h = g * G + hh;
            int r = (int)(t - q0) * G + hh;
            const float *ac = acc + (size_t)r * D;
            if (j->n_split > 1) {
                float *p = j->part + ((size_t)h * j->n_split + split) * (size_t)(2 + D);
                p[0] = m[r];
                p[1] = l[r];
                memcpy(p + 2, ac, sizeof(float) * (size_t)D);
            } else {
                float *o = a->out + t * qstride + (int64_t)h * D;
                float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
                for (int i = 0; i < D; i++) o[i] = ac[i] * inv;
            }
        }
    }
}

/* ---- Blocked attention for a batch of queries (prefill): a task is one KV head and a tile of
 * queries whose ATT_ROWS rows (query x grouped head) share every key and value row: keys are
 * gathered from the page list into blocks of ATT_BK (converted to f32 once), scored for all rows at
 * once with the rows in the vector lanes, and the values accumulated likewise; an online softmax
 * per row carries the running maximum and sum across blocks, as in flash attention. */

#define ATT_ROWS 32
#define ATT_BK 64

typedef struct attb_job {
    const be_attn *a;
    int group, tq, rp;     /* grouped heads, queries per tile, rows padded to 16 */
    int64_t n_tiles;
    float *scratch;
    size_t per_thread;     /* floats */
} attb_job;

typedef struct attb_tile {
    const be_attn *a;
    int D, nr, rp;
    int32_t qmin, qmax;
    const int32_t *rowpos;
    float *qt, *kb, *vb, *s, *o, *m, *l, *corr, *msub;
    int32_t *kpos;
    float *kbias;
} attb_tile;

static void attb_block(attb_tile *T, int nk)
{
    const be_attn *a = T->a;
    int nr = T->nr, rp = T->rp, D = T->D;
    vd_attn_scores(D, nk, rp, T->qt, T->kb, T->s);
    /* every row sees every key of the block: causally before all queries and inside every window
     * (pages need not come in position order, so the block's extremes are looked up) */
    int32_t kmin = INT32_MAX, kmax = INT32_MIN;
    for (int k = 0; k < nk; k++) {
        kmin = T->kpos[k] < kmin ? T->kpos[k] : kmin;
        kmax = T->kpos[k] > kmax ? T->kpos[k] : kmax;
    }
    int full = kmax <= T->qmin && (a->window <= 0 || kmin > T->qmax - a->window);
    for (int k = 0; k < nk; k++) {
        float *sk = T->s + (size_t)k * rp, bias = T->kbias[k];
        int32_t kp = T->kpos[k];
        if (bias != 0.0f)
            for (int r = 0; r < nr; r++) sk[r] += bias;
        if (!full)
            for (int r = 0; r < nr; r++) {
                int32_t qp = T->rowpos[r];
                if (kp > qp || (a->window > 0 && qp - kp >= a->window)) sk[r] = -INFINITY;
            }
    }
    float *mnew = T->msub;
    for (int r = 0; r < nr; r++) mnew[r] = T->m[r];
    for (int k = 0; k < nk; k++) {
        const float *sk = T->s + (size_t)k * rp;
        for (int r = 0; r < nr; r++) mnew[r] = sk[r] > mnew[r] ? sk[r] : mnew[r];
    }
    for (int r = 0; r < nr; r++) {
        if (mnew[r] == -INFINITY) {   /* nothing visible yet: weights exp(-inf) = 0, state unchanged */
            T->corr[r] = 1.0f;
            mnew[r] = 0.0f;
        } else {
            T->corr[r] = expf(T->m[r] - mnew[r]);   /* exp(-inf) = 0 on the first visible block */
            T->m[r] = mnew[r];
        }
    }
    for (int k = 0; k < nk; k++) {
        float *sk = T->s + (size_t)k * rp;
        for (int r = 0; r < nr; r++) sk[r] -= mnew[r];
    }
    vd_exp_f32((int64_t)nk * rp, T->s, T->s);
    for (int r = 0; r < nr; r++) T->l[r] *= T->corr[r];
    for (int k = 0; k < nk; k++) {
        const float *sk = T->s + (size_t)k * rp;
        for (int r = 0; r < nr; r++) T->l[r] += sk[r];
    }
    vd_attn_accum(D, nk, nr, rp, T->s, T->vb, T->corr, T->o);
}

static void attb_task(void *ctx, int64_t task, int thread)
{
    attb_job *j = ctx;
    const be_attn *a = j->a;
    const int D = a->head_dim, G = j->group, rp = j->rp;
    const int64_t qstride = (int64_t)a->n_head * D;
    int64_t tile = task % j->n_tiles;
    int g = (int)(task / j->n_tiles);
    int64_t q0 = tile * j->tq, q1 = q0 + j->tq < a->n_q ? q0 + j->tq : a->n_q;
    attb_tile T = { .a = a, .D = D, .nr = (int)(q1 - q0) * G, .rp = rp, .qmin = INT32_MAX, .qmax = INT32_MIN };
    float *f = j->scratch + (size_t)thread * j->per_thread;
    T.qt = f;
    T.kb = T.qt + (size_t)D * rp;
    T.vb = T.kb + (size_t)ATT_BK * D;
    T.s = T.vb + (size_t)ATT_BK * D;
    T.o = T.s + (size_t)ATT_BK * rp;
    T.m = T.o + (size_t)rp * D;
    T.l = T.m + rp;
    T.corr = T.l + rp;
    T.msub = T.corr + rp;
    T.kbias = T.msub + rp;
    T.kpos = (int32_t *)(T.kbias + ATT_BK);
    int32_t *rowpos = T.kpos + ATT_BK;
    T.rowpos = rowpos;
    /* the tile's queries transposed, padding rows zero */
    memset(T.qt, 0, sizeof(float) * (size_t)D * rp);
    for (int64_t t = q0; t < q1; t++) {
        int32_t qp = a->q_pos[t];
        if (qp < T.qmin) T.qmin = qp;
        if (qp > T.qmax) T.qmax = qp;
        for (int hh = 0; hh < G; hh++) {
            int r = (int)(t - q0) * G + hh;
            const float *q = a->q + t * qstride + (int64_t)(g * G + hh) * D;
            for (int d = 0; d < D; d++) T.qt[(size_t)d * rp + r] = q[d];
            rowpos[r] = qp;
        }
    }
    for (int r = 0; r < T.nr; r++) {
        T.m[r] = -INFINITY;
        T.l[r] = 0.0f;
    }
    memset(T.o, 0, sizeof(float) * (size_t)T.nr * D);
    int64_t pg0, pg1;
    head_range(a, g, &pg0, &pg1);
    /* Blocks hold the keys of one aligned range of ATT_BK positions: a query's sums then go the same
     * way whatever tile it is in and whatever the page list begins with (a decode step gives the
     * bits of the same token in a prefill batch). Keys no row of the tile can see are left out: for
     * every row they would add exact zeros. */
    int nk = 0;
    int32_t blk = INT32_MIN;
    for (int64_t ip = pg0; ip < pg1; ip++) {
        const be_kv_page *pg = &a->pages[ip];
        if (pg->n <= 0 || pg->pos[0] > T.qmax) continue;   /* positions ascend within a page */
        if (a->window > 0 && pg->pos[pg->n - 1] <= T.qmin - a->window) continue;   /* all too old */
        for (int32_t i = 0; i < pg->n; i++) {
            int32_t kp = pg->pos[i];
            if (kp > T.qmax) break;
            if (a->window > 0 && kp <= T.qmin - a->window) continue;
            if (pg->mask && !((pg->mask[i >> 6] >> (i & 63)) & 1u)) continue;
            if (nk && kp / ATT_BK != blk) {
                attb_block(&T, nk);
                nk = 0;
            }
            blk = kp / ATT_BK;
            size_t off = (size_t)i * (size_t)pg->stride + (size_t)g * (size_t)pg->head_step;
            vd_f16_to_f32(D, pg->k + off, T.kb + (size_t)nk * D);
            vd_f16_to_f32(D, pg->v + off, T.vb + (size_t)nk * D);
            T.kpos[nk] = kp;
            T.kbias[nk] = pg->bias ? pg->bias[i] : 0.0f;
            if (++nk == ATT_BK) {
                attb_block(&T, nk);
                nk = 0;
            }
        }
    }
    if (nk) attb_block(&T, nk);
    for (int64_t t = q0; t < q1; t++)
        for (int hh = 0; hh < G; hh++) {
            int r = (int)(t - q0) * G + hh;
            float *o = a->out + t * qstride + (int64_t)(g * G + hh) * D;
            float inv = T.l[r] > 0 ? 1.0f / T.l[r] : 0.0f;
            for (int d = 0; d < D; d++) o[d] = T.o[(size_t)r * D + d] * inv;
        }
}

static void attention_blocked(be_backend *b, const be_attn *a)
{
    cpu_impl *ci = impl_of(b);
    attb_job j;
    memset(&j, 0, sizeof j);
    j.a = a;
    j.group = a->n_head / a->n_head_kv;
    j.tq = ATT_ROWS / j.group > 0 ? ATT_ROWS / j.group : 1;
    j.rp = (j.tq * j.group + 15) / 16 * 16;
    j.n_tiles = (a->n_q + j.tq - 1) / j.tq;
    size_t D = (size_t)a->head_dim, rp = (size_t)j.rp;
    j.per_thread = (D * rp + 2 * ATT_BK * D + ATT_BK * rp + rp * D + 4 * rp + 2 * ATT_BK + rp + 16 + 15) & ~(size_t)15;
    if (grow((void **)&ci->att_scratch, &ci->att_scratch_cap, j.per_thread * sizeof(float) * (size_t)b->n_threads) != 0)
        abort();
    j.scratch = ci->att_scratch;
    tp_run(ci->pool, attb_task, &j, (int64_t)a->n_head_kv * j.n_tiles);
}

static void attention_pages(be_backend *b, const be_attn *a)
{
    cpu_impl *ci = impl_of(b);
    att_job j;
    memset(&j, 0, sizeof j);
    j.a = a;
    j.group = a->n_head / a->n_head_kv;
    j.n_tiles = (a->n_q + ATT_TILE_Q - 1) / ATT_TILE_Q;
    j.n_split = 1;
    if (a->n_q == 1) {
        /* decode: one query per head, so split each head's page list to use every thread */
        int64_t min_pages = INT64_MAX;
        for (int g = 0; g < a->n_head_kv; g++) {
            int64_t p0, p1;
            head_range(a, g, &p0, &p1);
            if (p1 - p0 < min_pages) min_pages = p1 - p0;
        }
        int64_t want = 2 * (int64_t)b->n_threads / a->n_head_kv;
        if (want > 16) want = 16;
        if (want > min_pages / 4) want = min_pages / 4;   /* at least 4 pages a split */
        if (want > 1) j.n_split = (int)want;
    }
    if (j.n_split == 1) {
        /* a batch, or a step whose list is not split: the blocked kernels (a step then gives the
         * bits the same token would get in a prefill batch) */
        attention_blocked(b, a);
        return;
    }
    int D = a->head_dim;
    int rows = ATT_TILE_Q * j.group;
    j.scratch_per_thread = (size_t)rows * (ATT_BLOCK_K + 2 + (size_t)D) + 16;
    if (grow((void **)&ci->att_scratch, &ci->att_scratch_cap,
             j.scratch_per_thread * sizeof(float) * (size_t)b->n_threads) != 0)
        abort();
    j.scratch = ci->att_scratch;
    if (j.n_split > 1) {
        size_t need = (size_t)a->n_head * j.n_split * (size_t)(2 + D) * sizeof(float);
        if (grow((void **)&ci->att_part, &ci->att_part_cap, need) != 0) abort();
        j.part = ci->att_part;
    }
    tp_run(ci->pool, att_task, &j, (int64_t)a->n_head_kv * j.n_tiles * j.n_split);
    if (j.n_split > 1) {
        /* Merge the per-split online-softmax states (decode: one query). */
        for (int h = 0; h < a->n_head; h++) {
            float mx = -INFINITY;
            for (int s = 0; s < j.n_split; s++) {
                float ms = j.part[((size_t)h * j.n_split + s) * (size_t)(2 + D)];
                if (ms > mx) mx = ms;
            }
            float *o = a->out + (int64_t)h * D;
            memset(o, 0, sizeof(float) * (size_t)D);
            float lsum = 0;
            for (int s = 0; s < j.n_split; s++) {
                const float *p = j.part + ((size_t)h * j.n_split + s) * (size_t)(2 + D);
                if (p[1] == 0) continue;
                float c = expf(p[0] - mx);
                lsum += p[1] * c;
                vd_axpy_f32(D, c, p + 2, o);
            }
            float inv = lsum > 0 ? 1.0f / lsum : 0.0f;
            for (int i = 0; i < D; i++) o[i] *= inv;
        }
    }
}

/* ---------------------------------------------------------------- selection scores */

typedef struct score_job {
    const float *m, *x;
    float *y;
    int64_t n_rows, dim, per;
} score_job;

static void score_task(void *ctx, int64_t t, int thread)
{
    (void)thread;
    score_job *j = ctx;
    int64_t r0 = t * j->per, r1 = r0 + j->per < j->n_rows ? r0 + j->per : j->n_rows;
    for (int64_t r = r0; r < r1; r++) j->y[r] = vd_dot_f32(j->dim, j->m + r * j->dim, j->x);
}

static void cpu_scores(be_backend *b, const float *m, int64_t n_rows, int64_t dim, const float *x, float *y)
{
    score_job j = { m, x, y, n_rows, dim, 0 };
    int64_t tasks = n_rows * dim >= (1 << 16) ? 4 * (int64_t)b->n_threads : 1;
    j.per = (n_rows + tasks - 1) / tasks;
    if (j.per < 1) j.per = 1;
    if (tasks == 1) {
        score_task(&j, 0, 0);
        return;
    }
    tp_run(impl_of(b)->pool, score_task, &j, (n_rows + j.per - 1) / j.per);
}

typedef struct bound_job {
    const be_bounds *r;
    int64_t n, per;
    float *u;
} bound_job;

static void bound_task(void *ctx, int64_t t, int thread)
{
    (void)thread;
    bound_job *j = ctx;
    const be_bounds *r = j->r;
    int64_t i0 = t * j->per, i1 = i0 + j->per < j->n ? i0 + j->per : j->n;
    int h = 0;
    for (int64_t i = i0; i < i1; i++) {
        while (i >= r->off[h + 1]) h++;
        if (r->end && i >= r->end[h]) continue;   /* room between heads: nothing there */
        const float *q = r->q + (int64_t)h * r->group * r->dim;
        float u = 0;   /* the group's queries in order, as one loop would add them */
        for (int g = 0; g < r->group; g++) u += vd_bound_f32(r->dim, q + (int64_t)g * r->dim, r->sum[i].mn, r->sum[i].mx);
        j->u[i] = u;
    }
}

static int by_id(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Each head's k best of the bounds u, by the pick's order (one row a head), as ascending indices. */
static void cpu_bound_best(be_bounds *r, float *u)
{
    float val[BE_PICK_MAX];
    for (int h = 0; h < r->n_head_kv; h++) {
        int32_t *best = r->best + (int64_t)h * r->k;
        be_pick p = { .logits = u + r->off[h], .n = (int32_t)be_bounds_count(r, h), .k = r->k, .val = val, .id = best };
        r->n_best[h] = 0;
        if (p.n <= 0) continue;
        cpu_pick_row(&p);
        qsort(best, (size_t)p.n_out, sizeof *best, by_id);
        r->n_best[h] = p.n_out;
    }
}

/* SentKV's choice (be_bounds.bits): each head's segments ranked lazily (kernels/segment_kernels.h). */
static void cpu_bound_segments(cpu_impl *ci, be_bounds *r, const float *u)
{
    int64_t most;
    be_bounds_total(r, &most);
    if (grow((void **)&ci->seg_at, &ci->seg_at_cap, sizeof(int64_t) * 2 * (size_t)most) ||
        grow((void **)&ci->seg_heap, &ci->seg_heap_cap, sizeof(uint64_t) * (size_t)most)) {
        /* no room to rank: every position attended, which is always correct */
        for (int64_t w = 0; w < r->n_head_kv * r->words; w++) r->bits[w] = 0;
        for (int h = 0; h < r->n_head_kv; h++) bm_set_range(r->bits + h * r->words, 0, r->len);
        return;
    }
    for (int h = 0; h < r->n_head_kv; h++) {
        const int64_t n = be_bounds_count(r, h);
        int64_t *n_of = ci->seg_at, *at = ci->seg_at + most, p = 0;
        for (int64_t i = 0; i < n; i++) {
            n_of[i] = r->sum[r->off[h] + i].n;
            at[i] = p;
            p += n_of[i];
        }
        sg_choose(u + r->off[h], n_of, at, n, r->budget, r->sinks, r->len, ci->seg_heap, r->bits + h * r->words,
                  r->words);
    }
}

static void cpu_bound_pages(be_backend *b, be_bounds *r)
{
    cpu_impl *ci = impl_of(b);
    int64_t n = r->off[r->n_head_kv];
    if (r->k > BE_PICK_MAX) r->k = BE_PICK_MAX;
    float *u = r->u;
    if (!u) {
        if (grow((void **)&ci->bound_u, &ci->bound_u_cap, sizeof(float) * (size_t)(n > 0 ? n : 1))) abort();
        u = ci->bound_u;
    }
    bound_job j = { r, n, 0, u };
    int64_t tasks = n * r->dim * r->group >= (1 << 16) ? 4 * (int64_t)b->n_threads : 1;
    j.per = (n + tasks - 1) / tasks;
    if (j.per < 1) j.per = 1;
    if (tasks == 1)
        bound_task(&j, 0, 0);
    else
        tp_run(ci->pool, bound_task, &j, (n + j.per - 1) / j.per);
    if (r->bits) cpu_bound_segments(ci, r, u);
    else if (r->k > 0) cpu_bound_best(r, u);
}

/* ---------------------------------------------------------------- CHESS's summary rows */

/* A unit's part of chunk c, a whole head row at once: per element the arithmetic of km_chunk_part
 * (the pages' parts added in order, then the scale), the pages looked up once. */
static void chunk_vec(const km_src *s, const km_req *q, int u, int64_t c, float *out)
{
    int64_t a, e;
    int D = s->head_dim;
    km_chunk_pages(q, c, &a, &e);
    for (int d = 0; d < D; d++) out[d] = 0.0f;
    for (int64_t i = a; i < e; i++) {
        km_ref r = km_get(s, u, i);
        for (int d = 0; d < D; d++) out[d] = QB_ADD(out[d], km_page_part(r, d));
    }
    float inv = km_inv(e - a);
    for (int d = 0; d < D; d++) out[d] = QB_MUL(out[d], inv);
}

typedef struct means_job {
    const be_key_means *m;
    km_src s;
    km_req q;
    km_outs out;
    int64_t dim;
} means_job;

/* One slot's row (kernels/mean_kernels.h: the CUDA kernels' floats). */
static void means_task(void *ctx, int64_t slot, int thread)
{
    (void)thread;
    const means_job *j = ctx;
    const km_req *q = &j->q;
    const km_src *s = &j->s;
    const int D = s->head_dim;
    float *row = km_row(q, j->out, j->dim, slot), tmp[KM_MAX_D];
    for (int u = 0; u < q->units; u++) {
        float *x = row + (int64_t)u * D;
        if (slot < q->np) {
            km_ref r = km_get(s, u, q->p0 + slot);
            for (int d = 0; d < D; d++) x[d] = km_page_part(r, d);
        } else if (slot < q->np + q->nc) {
            chunk_vec(s, q, u, q->c0 + slot - q->np, x);
        } else if (slot < q->np + q->nc + q->ng) {
            int64_t a, e;
            km_grid_chunks(q, q->g0 + slot - q->np - q->nc, &a, &e);
            for (int d = 0; d < D; d++) x[d] = 0.0f;
            for (int64_t c = a; c < e; c++) {
                chunk_vec(s, q, u, c, tmp);
                for (int d = 0; d < D; d++) x[d] = QB_ADD(x[d], tmp[d]);
            }
            float inv = km_inv(e - a);
            for (int d = 0; d < D; d++) x[d] = QB_MUL(x[d], inv);
        } else {   /* km_anchor_part's sums, a row at a time */
            int32_t t0;
            int64_t got, np = km_count(s, u);
            for (int d = 0; d < D; d++) x[d] = 0.0f;
            for (int64_t i = km_last_start(s, u, q->n_last, &t0, &got); i < np; i++, t0 = 0) {
                km_ref r = km_get(s, u, i);
                for (int32_t t = t0; t < r.n; t++)
                    for (int d = 0; d < D; d++) x[d] = QB_ADD(x[d], qb_half(r.k[(int64_t)t * r.stride + d]));
            }
            float inv = km_inv(got);
            for (int d = 0; d < D; d++) x[d] = QB_MUL(x[d], inv);
        }
    }
    if (!q->unit || km_is_anchor(q, slot)) return;
    double sq = 0.0;
    for (int u = 0; u < q->units; u++) sq = KM_DADD(sq, km_unit_sq(row + (int64_t)u * D, D));
    float inv = km_scale_of(sq);
    for (int64_t e = 0; e < j->dim; e++) row[e] = QB_MUL(row[e], inv);
}

/* From the pages' key sums (ksum) where the cache keeps them; rows over the thread pool. */
static void cpu_key_means(be_backend *b, const be_key_means *m)
{
    if (m->head_dim <= 0 || m->head_dim > KM_MAX_D) {
        fprintf(stderr, "kvchat: internal error: key means of head_dim %d (at most %d)\n", m->head_dim, KM_MAX_D);
        abort();
    }
    means_job j = { m, { m->lists, NULL, m->n_head_kv, m->head_dim }, km_req_of(m), { { NULL } }, 0 };
    j.dim = (int64_t)j.q.units * m->head_dim;
    j.out.o[0] = j.q.np ? m->page_rows + j.q.p0 * j.dim : NULL;
    j.out.o[1] = j.q.nc ? m->chunk_rows + j.q.c0 * j.dim : NULL;
    j.out.o[2] = j.q.ng ? m->grid_rows + j.q.g0 * j.dim : NULL;
    j.out.o[3] = m->anchor;
    int64_t n = km_slots(&j.q);
    if (n <= 0) return;
    if (n == 1 || n * j.dim < (1 << 16)) {
        for (int64_t i = 0; i < n; i++) means_task(&j, i, 0);
        return;
    }
    tp_run(impl_of(b)->pool, means_task, &j, n);
}

/* The attention mass (be_mass): rows side by side, a block of at most 64 at a time, each row's
 * weights into its slice of work (their sum in kernels/mass_kernels.h's order), then added token
 * range by token range in row order, so the floats are the definition's whatever the threads. */
typedef struct mass_job {
    const be_mass *m;
    int64_t T, chunk, r0, n;   /* the block: rows r0 .. r0 + n (n <= 64) */
    float factor[64];          /* row r0 + i's factor (MS_EMPTY: it sees no token) */
} mass_job;

static void mass_row(void *ctx, int64_t i, int tid)
{
    (void)tid;
    mass_job *j = ctx;
    const be_mass *m = j->m;
    int64_t r = j->r0 + i, t = r / m->group, D = m->head_dim, qp = m->q_pos0 + t;
    const float *q = m->q + t * m->q_stride + (int64_t)(m->first_head + (int)(r % m->group)) * D;
    float *s = m->work + i * j->T, mx = -INFINITY;
    int64_t e = 0;
    for (int64_t pi = 0; pi < m->n_pages; pi++) {
        const be_kv_page *p = &m->pages[pi];
        for (int32_t k = 0; k < p->n; k++, e++) {
            s[e] = ms_score(p->pos[k] > qp ? 0.0f : vd_dot_f32_f16(D, q, p->k + (size_t)k * (size_t)p->stride),
                            p->bias, p->pos, k, qp);
            if (s[e] > mx) mx = s[e];
        }
    }
    if (mx == -INFINITY) {
        j->factor[i] = MS_EMPTY;
        return;
    }
    for (e = 0; e < j->T; e++) s[e] = s[e] - mx;
    vd_exp_f32(j->T, s, s);
    j->factor[i] = ms_factor(mx, ms_row_sum(s, j->T));
}

static void mass_add(void *ctx, int64_t c, int tid)
{
    (void)tid;
    mass_job *j = ctx;
    const be_mass *m = j->m;
    int64_t a = c * j->chunk, b = a + j->chunk < j->T ? a + j->chunk : j->T;
    for (int64_t i = 0; i < j->n; i++) {   /* row after row, as ms_add */
        if (j->factor[i] == MS_EMPTY) continue;
        const float *w = m->work + i * j->T, f = j->factor[i];
        for (int64_t e = a; e < b; e++) m->acc[e] += w[e] * f;
    }
}

/* One KV head's mass (m->n_kv <= 1). */
static void mass_head(be_backend *b, const be_mass *m)
{
    int64_t T = 0;
    for (int64_t i = 0; i < m->n_pages; i++) T += m->pages[i].n;
    int64_t rows = m->n_q * m->group, per = T > 0 ? m->work_len / T : 0;
    if (rows <= 0 || T <= 0) return;
    if (per < 1 || m->head_dim <= 0) {
        fprintf(stderr, "kvchat: internal error: attention mass with %lld floats of work for %lld tokens\n",
                (long long)m->work_len, (long long)T);
        abort();
    }
    if (per > 64) per = 64;
    mass_job j = { m, T, 2048, 0, 0, { 0 } };
    tp_pool *pool = impl_of(b)->pool;
    for (j.r0 = 0; j.r0 < rows; j.r0 += per) {
        int64_t n = rows - j.r0 < per ? rows - j.r0 : per;
        j.n = n;
        if (n * T * m->head_dim < (1 << 16)) for (int64_t i = 0; i < n; i++) mass_row(&j, i, 0);
        else tp_run(pool, mass_row, &j, n);
        int64_t chunks = (T + j.chunk - 1) / j.chunk;
        if (chunks == 1 || n * T < (1 << 16)) for (int64_t c = 0; c < chunks; c++) mass_add(&j, c, 0);
        else tp_run(pool, mass_add, &j, chunks);
    }
}

/* KV head after KV head, each as a call of its own. */
static void cpu_attn_mass(be_backend *b, const be_mass *m)
{
    if (m->n_kv <= 1) {
        mass_head(b, m);
        return;
    }
    int64_t at = 0;
    for (int h = 0; h < m->n_kv; h++) {
        be_mass one = *m;
        one.pages = m->pages + m->head_pages[h];
        one.n_pages = m->head_pages[h + 1] - m->head_pages[h];
        one.first_head = m->first_head + h * m->group;
        one.acc = m->acc + at;
        one.n_kv = 1;
        one.head_pages = NULL;
        mass_head(b, &one);
        for (int64_t i = 0; i < one.n_pages; i++) at += one.pages[i].n;
    }
}

/* Rows not in the cache yet become one more page per KV head (f16, all heads side by side), after
 * that head's pages: the order and the values the cache would give them. */
static void cpu_attention(be_backend *b, const be_attn *a)
{
    cpu_impl *ci = impl_of(b);
    if ((a->sel_best || a->sel_bits || a->n_cur > 0) && a->n_head_kv > 64) {   /* the offsets below */
        fprintf(stderr, "kvchat: internal error: %d KV heads (at most 64)\n", a->n_head_kv);
        abort();
    }
    if (a->sel_best) {   /* a selection by bounds: the list it stands for, then as any list */
        if (grow((void **)&ci->sel_pages, &ci->sel_pages_cap, sizeof(be_kv_page) * (size_t)be_attn_sel_len(a)))
            abort();
        int64_t hp[65];
        be_attn c = *a;
        c.n_pages = be_attn_sel_list(a, ci->sel_pages, hp);
        c.pages = ci->sel_pages;
        c.head_pages = hp;
        c.sel_best = c.sel_n_best = NULL;
        c.sel_from = NULL;
        cpu_attention(b, &c);
        return;
    }
    if (a->sel_bits) {   /* a choice of tokens by bounds: the list with masks it stands for */
        if (grow((void **)&ci->sel_pages, &ci->sel_pages_cap, sizeof(be_kv_page) * (size_t)a->n_pages) ||
            grow((void **)&ci->sel_masks, &ci->sel_masks_cap, sizeof(uint64_t) * (size_t)be_attn_bits_words(a)))
            abort();
        int64_t hp[65];
        be_attn c = *a;
        c.n_pages = be_attn_bits_list(a, ci->sel_pages, ci->sel_masks, hp);
        c.pages = ci->sel_pages;
        c.head_pages = hp;
        c.sel_bits = NULL;
        c.shape = 0;
        cpu_attention(b, &c);
        return;
    }
    if (a->n_cur <= 0) {
        attention_pages(b, a);
        return;
    }
    int64_t kvd = (int64_t)a->n_head_kv * a->head_dim, n = a->n_cur;
    size_t n_list = (size_t)be_attn_rows_len(a);
    if (grow((void **)&ci->cur16, &ci->cur16_cap, sizeof(uint16_t) * 2 * (size_t)(n * kvd)) ||
        grow((void **)&ci->cur_pages, &ci->cur_pages_cap, sizeof(be_kv_page) * n_list))
        abort();
    uint16_t *k16 = ci->cur16, *v16 = ci->cur16 + n * kvd;
    vd_f32_to_f16(n * kvd, a->cur_k, k16);
    vd_f32_to_f16(n * kvd, a->cur_v, v16);
    int64_t hp[65];
    int64_t e = be_attn_rows_list(a, k16, v16, a->cur_pos, ci->cur_pages, hp);
    be_attn c = *a;
    c.pages = ci->cur_pages;
    c.n_pages = e;
    c.head_pages = hp;
    c.n_cur = 0;
    attention_pages(b, &c);
}

/* ---------------------------------------------------------------- element-wise */

static void add_norm_rows(rows_job *j, int64_t r0, int64_t r1)
{
    for (int64_t r = r0; r < r1; r++) {
        float *x = j->y + r * j->dim, *o = j->o + r * j->dim;
        if (j->post) vd_rmsnorm_f32(j->dim, o, j->post, o, j->eps);
        for (int64_t i = 0; i < j->dim; i++) x[i] += o[i];
        if (j->w) vd_rmsnorm_f32(j->dim, x, j->w, j->h + r * j->dim, j->eps);
    }
}

static void cpu_add_norm(be_backend *b, float *x, float *o, const float *post, const float *w, float *h, int64_t rows,
                         int64_t dim, float eps)
{
    rows_job j = { .rows = rows, .fn = add_norm_rows, .y = x, .o = o, .post = post, .w = w, .h = h, .dim = dim,
                   .eps = eps };
    run_rows(b, &j);
}

static void cpu_pick(be_backend *b, be_pick *p, int n)
{
    (void)b;
    for (int i = 0; i < n; i++) cpu_pick_row(&p[i]);
}

struct tp_pool *be_cpu_pool(be_backend *cpu) { return impl_of(cpu)->pool; }

/* ---------------------------------------------------------------- table */

static void cpu_destroy(be_backend *b)
{
    cpu_impl *ci = b->impl;
    if (ci) {
        tp_free(ci->pool);
        for (int i = 0; i < MAX_MM; i++) free(ci->act_buf[i]);
        free(ci->panel_buf);
        free(ci->att_part);
        free(ci->att_scratch);
        free(ci->cur16);
        free(ci->cur_pages);
        free(ci->sel_pages);
        free(ci->sel_masks);
        free(ci->bound_u);
        free(ci->seg_at);
        free(ci->seg_heap);
        free(ci);
    }
    free(b);
}

static const be_ops cpu_ops = {
    .name = "cpu",
    .matmul = cpu_matmul,
    .rmsnorm = cpu_rmsnorm,
    .qk_rope = cpu_qk_rope,
    .glu = cpu_glu,
    .get_rows = cpu_get_rows,
    .attention = cpu_attention,
    .scores = cpu_scores,
    .bound_pages = cpu_bound_pages,
    .destroy = cpu_destroy,
    .add_norm = cpu_add_norm,
    .pick = cpu_pick,
    .key_means = cpu_key_means,
    .attn_mass = cpu_attn_mass,
    .host_pool = be_cpu_pool,
    .lsh_hits = be_host_lsh_hits,
    .soft_links = be_host_soft_links,
    .merge_heads = be_host_merge_heads,
};

be_backend *be_cpu_create(int n_threads, char *err, size_t errlen)
{
    be_backend *b = calloc(1, sizeof *b);
    cpu_impl *ci = calloc(1, sizeof *ci);
    if (!b || !ci) {
        free(b);
        free(ci);
        snprintf(err, errlen, "out of memory creating the CPU backend");
        return NULL;
    }
    ci->pool = tp_create(n_threads, err, errlen);
    if (!ci->pool) {
        free(b);
        free(ci);
        return NULL;
    }
    b->ops = &cpu_ops;
    b->n_threads = tp_n_threads(ci->pool);
    b->impl = ci;
    return b;
}

void be_free(be_backend *b)
{
    if (b) b->ops->destroy(b);
}

void be_host_f32_to_f16(int64_t n, const float *x, uint16_t *y) { vd_f32_to_f16(n, x, y); }

void be_host_key_summary(int64_t n, const uint16_t *k, float *sum, float *mn, float *mx)
{
    vd_key_summary(n, 1, k, n, sum, mn, mx);
}

void be_host_key_summary_rows(int64_t n, int64_t rows, const uint16_t *k, int64_t stride, float *sum, float *mn,
                              float *mx)
{
    vd_key_summary(n, rows, k, stride, sum, mn, mx);
}
float be_host_dot_f32_f16(int64_t n, const float *a, const uint16_t *b) { return vd_dot_f32_f16(n, a, b); }

void be_host_bits_overlap(int64_t words, const uint64_t *now, uint64_t *last, int64_t *set, int64_t *shared)
{
    vd_bits_overlap(words, now, last, set, shared);
}

int be_supports_weight(const be_backend *b, uint32_t type)
{
    return quant_supported(type) && vd_get_dot(type) != NULL;
}
