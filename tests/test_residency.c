/* test_residency.c - the forward pass keeps its side of the residency contract (kernels/backend.h).
 *
 * A device backend leaves op outputs on the device, so the forward pass must announce every host
 * read and write of a bound buffer. This checks that without a GPU: a "shadow" backend runs the CPU
 * backend's ops on twins of the bound buffers (kernels/act_mirror.c with host memory as the device),
 * and fills the host copy of everything an op writes with NaN until the host asks for it. A read the
 * forward pass forgets to announce then sees NaN, a write it forgets never reaches the twins, and
 * either changes the logits; with every announcement in place they are bit-identical to the CPU
 * backend's, prefill and decode, with and without the policies that read queries on the host. */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/act_mirror.h"
#include "kernels/backend.h"
#include "kernels/page_fill.h"
#include "engine/forward.h"
#include "engine/kvcache.h"
#include "engine/model.h"
#include "engine/policy/policy.h"
#include "engine/sampler.h"
#include "tests/fwd_fixture.h"

#define TD "../shared/testdata/"

typedef struct shadow {
    be_backend *cpu;
    am_table t;
    int ignore_reads;   /* drop host_read announcements (the test that this test can fail) */
    int64_t ops, fail_at;   /* ops run; the op that fails as if the device were out of memory (0: none) */
    int failed;
    volatile sig_atomic_t *cancel_too;   /* raised as the op fails: a Ctrl-C right after a failure */
    int reads;          /* host reads announced since the last embedding (in the last step) */
    int reads_all;      /* host reads announced (the whole run) */
    size_t refuse_bytes;   /* binds of this size fail (0: none): a device without room for buffers that big */
    int binds;          /* binds made (the whole run) */
    uint64_t bytes_read;   /* bytes of every host read announced (the whole run) */
    int waits;          /* waits for the shadow device since the last embedding */
    int waits_all;      /* and since the shadow was made */
    int bounds;         /* bound_pages calls since the last embedding */
    int bound_waits;    /* of them, those that waited to send their answer back (as a device's do,
                           unless the answer stays for attention: be_bounds.best bound) */
    int bounds_on_host; /* kept best written on the host instead, announced (the CUDA backend's
                           way when the summaries do not fit on the device) */
    int gather_on_twin; /* embedding rows written on the twin (the CUDA backend's gather of a weight it
                           holds) instead of on the host */
    int joined;         /* attention_seqs calls of more than one sequence */
    int attn_from;      /* attention calls whose list started as another's (be_attn.from_table) */
    int means_from;     /* key_means lists likewise (be_page_list.from_table) */
    int64_t rows_named; /* rows page_rows named, each checked against its page (s_page_rows) */
    int64_t rows_moved; /* rows page_moves named, each checked against both pages (s_page_moves) */
    int64_t pages_moved;   /* fresh pages those rows filled */
    /* downloads in flight: the device's bytes as they were when issued, landing on the host only at
     * the next wait (so a host read that skips the wait sees the spoiled copy) */
    struct pending { void *dst, *bytes; size_t n; } *pend;
    int n_pend, cap_pend;
} shadow;

static shadow *sh(be_backend *b) { return (shadow *)b->impl; }

/* Device memory starts as NaN, so an op that reads a blank buffer's bytes before one wrote them (the
 * forward pass binds its scratch blank: nothing of the host's goes up) spoils the logits. */
static void *d_alloc(void *ud, size_t n)
{
    void *p = malloc(n);
    if (p) memset(p, 0xff, n);
    return p;
}
static void d_release(void *ud, void *p) { free(p); }
static void d_copy(void *ud, void *d, const void *s, size_t n) { memcpy(d, s, n); }
static void d_download(void *ud, void *d, const void *src, size_t n)
{
    shadow *s = ud;
    if (s->n_pend == s->cap_pend) {
        s->cap_pend = s->cap_pend ? 2 * s->cap_pend : 16;
        s->pend = realloc(s->pend, sizeof *s->pend * (size_t)s->cap_pend);
        cr_assert(s->pend);
    }
    void *copy = malloc(n);
    cr_assert(copy);
    memcpy(copy, src, n);
    s->pend[s->n_pend++] = (struct pending){ d, copy, n };
}
static void d_wait(void *ud)
{
    shadow *s = ud;
    for (int i = 0; i < s->n_pend; i++) {
        memcpy(s->pend[i].dst, s->pend[i].bytes, s->pend[i].n);
        free(s->pend[i].bytes);
    }
    s->n_pend = 0;
    s->waits++;
    s->waits_all++;
}

/* Count an op; 1 when it must not run: it is the one chosen to fail, or one after it, before the
 * caller has asked (a device backend skips work once an op failed). */
static int skip(be_backend *b)
{
    shadow *s = sh(b);
    if (++s->ops == s->fail_at) {
        s->failed = 1;
        if (s->cancel_too) *s->cancel_too = 1;
    }
    return s->failed;
}

static int s_failed(be_backend *b, char *err, size_t errlen)
{
    if (!sh(b)->failed) return 0;
    sh(b)->failed = 0;
    snprintf(err, errlen, "out of shadow device memory at op %lld", (long long)sh(b)->fail_at);
    return 1;
}

/* The twin of an op's input, or the host array when it is not bound. */
static const float *in(be_backend *b, const float *p, size_t n)
{
    const float *d = am_dev_in(&sh(b)->t, p, n * sizeof(float));
    return d ? d : p;
}

/* The twin of a range an op reads and then writes (brought up to date first), or the host array. */
static float *inout(be_backend *b, float *p, size_t n)
{
    float *d = am_dev_out(&sh(b)->t, p, n * sizeof(float));
    return d ? d : p;
}

/* A bound range's host copy after an op wrote its twin: stale until read back, so NaN. */
static void spoil(be_backend *b, float *p, size_t n)
{
    if (!am_bound(&sh(b)->t, p, n * sizeof(float))) return;
    for (size_t i = 0; i < n; i++) p[i] = NAN;
}

/* The twin of an op's output, with the host copy spoiled (the op writes all of it, reads none). */
static float *out(be_backend *b, float *p, size_t n)
{
    float *d = inout(b, p, n);
    spoil(b, p, n);
    return d;
}

static void s_matmul(be_backend *b, const be_mm *mms, int n_mm, const float *x, int64_t n_tok)
{
    if (skip(b)) return;
    be_mm m[8];
    const float *dx = in(b, x, (size_t)(n_tok * mms[0].w->n_in));
    for (int i = 0; i < n_mm; i++) {
        m[i] = mms[i];
        m[i].y = out(b, mms[i].y, (size_t)(n_tok * mms[i].w->n_out));
    }
    sh(b)->cpu->ops->matmul(sh(b)->cpu, m, n_mm, dx, n_tok);
}

static void s_rmsnorm(be_backend *b, const float *x, const float *w, float *y, int64_t rows, int64_t dim, float eps)
{
    if (skip(b)) return;
    size_t n = (size_t)(rows * dim);
    const float *dx = x == y ? NULL : in(b, x, n);
    float *dy = x == y ? inout(b, y, n) : out(b, y, n);
    sh(b)->cpu->ops->rmsnorm(sh(b)->cpu, dx ? dx : dy, w, dy, rows, dim, eps);
    if (x == y) spoil(b, y, n);
}

static void s_qk_rope(be_backend *b, const be_qk *r)
{
    if (skip(b)) return;
    size_t nq = (size_t)(r->n_tok * r->n_head * r->head_dim), nk = (size_t)(r->n_tok * r->n_head_kv * r->head_dim);
    be_qk c = *r;
    c.q = inout(b, r->q, nq);
    c.k = inout(b, r->k, nk);
    sh(b)->cpu->ops->qk_rope(sh(b)->cpu, &c);
    spoil(b, r->q, nq);
    spoil(b, r->k, nk);
}

static void s_glu(be_backend *b, float *gate, const float *up, int64_t n, int gelu)
{
    if (skip(b)) return;
    const float *du = in(b, up, (size_t)n);
    sh(b)->cpu->ops->glu(sh(b)->cpu, inout(b, gate, (size_t)n), du, n, gelu);
    spoil(b, gate, (size_t)n);
}

/* Embedding rows are written on the host, as the CUDA backend does for a weight it does not hold,
 * or on the twin, as it does for one it holds (gather_on_twin). */
static void s_get_rows(be_backend *b, const be_weight *w, const int32_t *ids, int64_t n, float scale, float *o)
{
    if (skip(b)) return;
    sh(b)->reads = sh(b)->waits = sh(b)->bounds = sh(b)->bound_waits = 0;
    size_t nv = (size_t)(n * w->n_in);
    if (sh(b)->gather_on_twin) {
        sh(b)->cpu->ops->get_rows(sh(b)->cpu, w, ids, n, scale, out(b, o, nv));
        return;
    }
    am_host_write(&sh(b)->t, o, sizeof(float) * nv);
    sh(b)->cpu->ops->get_rows(sh(b)->cpu, w, ids, n, scale, o);
}

static void s_attention(be_backend *b, const be_attn *a)
{
    sh(b)->attn_from += a->from_table != 0;
    if (skip(b)) return;
    be_attn c = *a;
    size_t nq = (size_t)(a->n_q * a->n_head * a->head_dim);
    c.q = in(b, a->q, nq);
    if (a->n_cur > 0) {
        size_t nc = (size_t)(a->n_cur * a->n_head_kv * a->head_dim);
        c.cur_k = in(b, a->cur_k, nc);
        c.cur_v = in(b, a->cur_v, nc);
    }
    if (a->sel_best) {   /* where the bounds left it */
        const int32_t *d = am_dev_in(&sh(b)->t, a->sel_best, sizeof(int32_t) * (size_t)(a->n_head_kv * a->sel_k));
        const int32_t *dn = am_dev_in(&sh(b)->t, a->sel_n_best, sizeof(int32_t) * (size_t)a->n_head_kv);
        c.sel_best = d ? d : a->sel_best;
        c.sel_n_best = dn ? dn : a->sel_n_best;
    }
    if (a->sel_bits) {   /* where the bounds left it */
        const uint64_t *d = am_dev_in(&sh(b)->t, a->sel_bits, sizeof(uint64_t) * (size_t)(a->n_head_kv * a->sel_words));
        c.sel_bits = d ? d : a->sel_bits;
    }
    c.out = out(b, a->out, nq);
    sh(b)->cpu->ops->attention(sh(b)->cpu, &c);
}

/* A batch's calls: the forward pass lays them out as one launch's (a device backend's one launch
 * depends on it), then each as attention. */
static void s_attention_seqs(be_backend *b, const be_attn *a, int n)
{
    if (n > 1) {
        cr_assert(be_attn_seqs_joined(a, n), "the forward pass's %d calls of a batch are not laid out as one", n);
        sh(b)->joined++;
    }
    for (int i = 0; i < n; i++) s_attention(b, &a[i]);
}

/* Read from the twins where the matrix and the anchor are bound (CHESS binds its summaries and
 * announces the rows it rewrites), written to the twin where the scores are; never skipped, as
 * the CUDA backend's scores always answer (the host computes them once an op failed). */
static void s_scores(be_backend *b, const float *m, int64_t n_rows, int64_t dim, const float *x, float *y)
{
    const float *dm = in(b, m, (size_t)(n_rows * dim)), *dx = in(b, x, (size_t)dim);
    sh(b)->cpu->ops->scores(sh(b)->cpu, dm, n_rows, dim, dx, out(b, y, (size_t)n_rows));
}

/* CHESS's rows and anchor written on the twins (as the CUDA backend computes them from its copies
 * of the pages: nothing goes up); on the host once an op failed, as the CUDA backend then does.
 * Never skipped: CHESS counts the rows as computed. */
static void s_key_means(be_backend *b, const be_key_means *m)
{
    for (int l = 0; l < m->n_lists; l++) sh(b)->means_from += m->lists[l].from_table != 0;
    be_key_means c = *m;
    size_t dim = (size_t)m->n_lists * (size_t)m->n_head_kv * (size_t)m->head_dim;
    float *const rows[4] = { m->p1 > m->p0 ? m->page_rows : NULL, m->c1 > m->c0 ? m->chunk_rows : NULL,
                             m->g1 > m->g0 ? m->grid_rows : NULL, m->n_last > 0 ? m->anchor : NULL };
    const size_t first[4] = { (size_t)m->p0 * dim, (size_t)m->c0 * dim, (size_t)m->g0 * dim, 0 };
    const size_t n[4] = { (size_t)m->p1 * dim, (size_t)m->c1 * dim, (size_t)m->g1 * dim, dim };
    float **to[4] = { &c.page_rows, &c.chunk_rows, &c.grid_rows, &c.anchor };
    for (int i = 0; i < 4; i++) {
        if (!rows[i]) continue;
        if (sh(b)->failed)   /* exactly the rows the host writes, as the CUDA backend announces */
            am_host_write(&sh(b)->t, rows[i] + first[i], (n[i] - first[i]) * sizeof(float));
        else
            *to[i] = out(b, rows[i], n[i]);   /* rows before the range stay as they are on the twin */
    }
    sh(b)->cpu->ops->key_means(sh(b)->cpu, &c);
}

/* The attention mass on the host, its queries read back first, as the CUDA backend computes it
 * (after a failure too, from the host's queries). */
static void s_attn_mass(be_backend *b, const be_mass *m)
{
    if (m->n_q <= 0) return;
    am_range r = { m->q, sizeof(float) * (size_t)((m->n_q - 1) * m->q_stride +
                                                  (int64_t)(m->first_head + m->group) * m->head_dim) };
    if (!sh(b)->failed) am_host_read(&sh(b)->t, &r, 1);
    sh(b)->cpu->ops->attn_mass(sh(b)->cpu, m);
}

static void s_add_norm(be_backend *b, float *x, float *o, const float *post, const float *w, float *h, int64_t rows,
                       int64_t dim, float eps)
{
    if (skip(b)) return;
    size_t n = (size_t)(rows * dim);
    float *dx = inout(b, x, n), *dox = inout(b, o, n), *dh = w ? out(b, h, n) : h;
    sh(b)->cpu->ops->add_norm(sh(b)->cpu, dx, dox, post, w, dh, rows, dim, eps);
    spoil(b, x, n);
    spoil(b, o, n);
}

/* An int32 array an op writes: its twin, with the host copy spoiled (-7) until read back; or the
 * host array when it is not bound. */
static int32_t *out_i32(be_backend *b, int32_t *p, size_t n)
{
    int32_t *d = am_dev_out(&sh(b)->t, p, n * sizeof(int32_t));
    if (!d) return p;
    for (size_t i = 0; i < n; i++) p[i] = -7;
    return d;
}

/* A bitmap an op writes: its twin, with the host copy spoiled (every bit set) until read back; or
 * the host array when it is not bound. */
static uint64_t *out_u64(be_backend *b, uint64_t *p, size_t n)
{
    uint64_t *d = am_dev_out(&sh(b)->t, p, n * sizeof(uint64_t));
    if (!d) return p;
    for (size_t i = 0; i < n; i++) p[i] = ~0ull;
    return d;
}

/* The queries are read on the device, as a GPU reads them, and the answer comes back with a wait,
 * or stays on the twin for attention where best is bound (no wait), or, with bounds_on_host, is
 * written on the host after a wait and announced; a skipped op leaves no best pages. */
static void s_bound_pages(be_backend *b, be_bounds *r)
{
    shadow *s = sh(b);
    int keep = r->bits ? am_bound(&s->t, r->bits, sizeof(uint64_t)) : r->k > 0 && am_bound(&s->t, r->best, sizeof(int32_t));
    size_t n_bits = r->bits ? (size_t)(r->n_head_kv * r->words) : 0;
    if (skip(b)) {
        for (int h = 0; h < r->n_head_kv && !keep; h++)
            if (r->n_best) r->n_best[h] = 0;
        return;
    }
    be_bounds c = *r;
    c.q = in(b, r->q, (size_t)(r->n_head_kv * r->group * r->dim));
    int32_t k = r->k < BE_PICK_MAX ? r->k : BE_PICK_MAX;
    s->bounds++;
    if (!keep || s->bounds_on_host) {
        s->bound_waits++;
        d_wait(s);
        am_waited(&s->t);
    }
    if (keep && r->bits) {   /* SentKV's choice: left on the twin, or written on the host and announced */
        if (s->bounds_on_host) am_host_write(&s->t, r->bits, sizeof(uint64_t) * n_bits);
        else c.bits = out_u64(b, r->bits, n_bits);
    } else if (keep && s->bounds_on_host) {
        am_host_write(&s->t, r->best, sizeof(int32_t) * (size_t)(r->n_head_kv * k));
        am_host_write(&s->t, r->n_best, sizeof(int32_t) * (size_t)r->n_head_kv);
    } else if (keep) {
        c.best = out_i32(b, r->best, (size_t)(r->n_head_kv * k));
        c.n_best = out_i32(b, r->n_best, (size_t)r->n_head_kv);
    }
    s->cpu->ops->bound_pages(s->cpu, &c);
    r->k = c.k;
}

/* 1 when a bind of that many bytes is refused (refuse_bytes); else counted. */
static int refused(be_backend *b, size_t bytes)
{
    shadow *s = sh(b);
    if (s->refuse_bytes && bytes == s->refuse_bytes) return 1;
    s->binds++;
    return 0;
}

static int s_bind(be_backend *b, void *host, size_t bytes, char *err, size_t errlen)
{
    if (!refused(b, bytes) && am_bind(&sh(b)->t, host, bytes) == 0) return 0;
    snprintf(err, errlen, "binding %zu bytes failed", bytes);
    return -1;
}

static int s_bind_blank(be_backend *b, void *host, size_t bytes, int pin, char *err, size_t errlen)
{
    if (!refused(b, bytes) && am_bind_blank(&sh(b)->t, host, bytes, pin) == 0) return 0;
    snprintf(err, errlen, "binding %zu bytes failed", bytes);
    return -1;
}

static void s_unbind(be_backend *b, void *host) { am_unbind(&sh(b)->t, host); }

static void s_host_read(be_backend *b, const be_range *r, int n)
{
    if (sh(b)->ignore_reads) return;
    sh(b)->reads++;
    sh(b)->reads_all++;
    for (int i = 0; i < n; i++) sh(b)->bytes_read += r[i].bytes;
    am_range ar[8];
    cr_assert(n <= 8);
    for (int i = 0; i < n; i++) ar[i] = (am_range){ r[i].p, r[i].bytes };
    am_host_read(&sh(b)->t, ar, n);
}

static void s_host_write(be_backend *b, void *p, size_t bytes) { am_host_write(&sh(b)->t, p, bytes); }

static void s_host_prefetch(be_backend *b, const be_range *r, int n)
{
    am_range ar[8];
    cr_assert(n <= 8);
    for (int i = 0; i < n; i++) ar[i] = (am_range){ r[i].p, r[i].bytes };
    am_host_prefetch(&sh(b)->t, ar, n);
}

/* The pick on the twin, then the wait a device makes to send its answer back. */
static void s_pick(be_backend *b, be_pick *ps, int n)
{
    if (skip(b)) return;
    for (int i = 0; i < n; i++) {
        be_pick *p = &ps[i], c = *p;
        c.logits = inout(b, p->logits, (size_t)p->n);   /* soft-capped in place */
        spoil(b, p->logits, (size_t)p->n);
        sh(b)->cpu->ops->pick(sh(b)->cpu, &c, 1);
        p->k = c.k;
        p->n_out = c.n_out;
        p->h = c.h;
        p->vh = c.vh;
    }
    d_wait(sh(b));   /* one wait for the rows, as a device's */
    am_waited(&sh(b)->t);
}

static void s_destroy(be_backend *b)
{
    cr_expect_eq(sh(b)->t.n, 0, "%d buffers still bound", sh(b)->t.n);
    am_free(&sh(b)->t);
    cr_expect_eq(sh(b)->n_pend, 0, "a download still in flight");
    free(sh(b)->pend);
    be_free(sh(b)->cpu);
    free(sh(b));
    free(b);
}

/* The ops a layer runs (the tests that fail a given op count them): the q/k/v product, qk_rope,
 * attention, the output product, add_norm, the gate/up product, glu, the down product, add_norm;
 * Quest adds its bounds before attention on global layers. */
enum { LAYER_OPS = 9 };

/* The rows the forward pass says a page took from a bound buffer are, rounded as a device rounds
 * them from its twin (kernels/page_fill.h), the page's rows, at the positions said. */
static void s_page_rows(be_backend *b, const be_page_rows *r, int n)
{
    shadow *s = sh(b);
    for (int i = 0; i < n; i++) {
        const be_page_rows *e = &r[i];
        const int32_t dim = e->page.stride;
        cr_assert(e->n > 0 && e->row0 >= 0 && e->row0 + e->n <= e->page.n, "rows %d + %d of a page of %d", e->row0,
                  e->n, e->page.n);
        const size_t span = sizeof(float) * (size_t)((int64_t)(e->n - 1) * e->stride + dim);
        const float *dk = am_dev_in(&s->t, e->k, span), *dv = am_dev_in(&s->t, e->v, span);
        cr_assert(dk && dv, "page_rows names rows outside the bound buffers");
        s->rows_named += e->n;
        if (s->ignore_reads) continue;   /* the host's rows are spoiled on purpose */
        for (int32_t t = 0; t < e->n; t++) {
            cr_assert_eq(e->page.pos[e->row0 + t], e->pos0 + t, "row %d: position %d, named %d", e->row0 + t,
                         e->page.pos[e->row0 + t], e->pos0 + t);
            const uint16_t *hk = e->page.k + (size_t)(e->row0 + t) * (size_t)dim;
            const uint16_t *hv = e->page.v + (size_t)(e->row0 + t) * (size_t)dim;
            for (int32_t d = 0; d < dim; d++) {
                cr_assert_eq(pf_half(dk[(int64_t)t * e->stride + d]), hk[d], "row %d, key element %d", e->row0 + t, d);
                cr_assert_eq(pf_half(dv[(int64_t)t * e->stride + d]), hv[d], "row %d, value element %d", e->row0 + t,
                             d);
            }
        }
    }
}

/* An eviction's moves are what the host did: each fresh page's runs come together, in order of its
 * rows, cover them all, and each run's rows (keys, values, positions) are its source's rows, the
 * source still held. */
static void s_page_moves(be_backend *b, const be_page_move *m, int n)
{
    shadow *s = sh(b);
    for (int i = 0; i < n;) {
        const be_page_move *first = &m[i];
        int32_t covered = 0;
        for (; i < n && m[i].dst.k == first->dst.k; i++) {
            const be_page_move *e = &m[i];
            const size_t R = (size_t)e->dst.stride;
            cr_assert_eq(e->dst_row, covered, "a fresh page's runs out of order: row %d after %d", e->dst_row, covered);
            cr_assert(e->n > 0 && e->src_row >= 0 && e->src_row + e->n <= e->src.n, "rows %d + %d of a page of %d",
                      e->src_row, e->n, e->src.n);
            cr_assert(e->src.stride == e->dst.stride && e->dst.gen == first->dst.gen && !e->dst.bias);
            cr_assert(!memcmp(e->dst.k + e->dst_row * R, e->src.k + e->src_row * R, sizeof(uint16_t) * R * e->n) &&
                          !memcmp(e->dst.v + e->dst_row * R, e->src.v + e->src_row * R, sizeof(uint16_t) * R * e->n) &&
                          !memcmp(e->dst.pos + e->dst_row, e->src.pos + e->src_row, sizeof(int32_t) * e->n),
                      "a run's rows are not its source's");
            covered += e->n;
            s->rows_moved += e->n;
        }
        cr_assert_eq(covered, first->dst.n, "a fresh page's runs cover %d of its %d rows", covered, first->dst.n);
        s->pages_moved++;
    }
}

static const be_ops shadow_ops = {
    .name = "shadow",
    .matmul = s_matmul,
    .rmsnorm = s_rmsnorm,
    .qk_rope = s_qk_rope,
    .glu = s_glu,
    .get_rows = s_get_rows,
    .attention = s_attention,
    .scores = s_scores,
    .bound_pages = s_bound_pages,
    .destroy = s_destroy,
    .add_norm = s_add_norm,
    .bind = s_bind,
    .unbind = s_unbind,
    .host_read = s_host_read,
    .host_write = s_host_write,
    .failed = s_failed,
    .pick = s_pick,
    .host_prefetch = s_host_prefetch,
    .key_means = s_key_means,
    .bind_blank = s_bind_blank,
    .attn_mass = s_attn_mass,
    .attention_seqs = s_attention_seqs,
    .page_rows = s_page_rows,
    .page_moves = s_page_moves,
};

static be_backend *shadow_create(void)
{
    char err[256];
    be_backend *b = calloc(1, sizeof *b);
    shadow *s = calloc(1, sizeof *s);
    cr_assert(b && s);
    s->cpu = be_cpu_create(2, err, sizeof err);
    cr_assert(s->cpu, "%s", err);
    am_device d = { s, d_alloc, d_release, d_copy, d_download, d_wait, NULL };
    am_init(&s->t, &d);
    b->ops = &shadow_ops;
    b->impl = s;
    b->n_threads = 2;
    return b;
}

static int32_t *prompt(const model *m, size_t *n) { return fwd_fixture_prompt(m, TD "prompts/p3.txt", n); }

#define STEPS 8

/* What the last run's policy set recorded (when it had one): its statistics, the last step's
 * pages and every step's page map (how often each page was attended). */
static pol_step_stats last_stats;
static int last_pages[256], n_last_pages;
static int64_t last_map[512], n_last_map;

/* The KV pages' size in the runs below: the prompt fills 88 tokens, so at 16 its STEPS decode steps
 * stay in one page; smaller pages have steps open pages of their own. */
static int run_page = 16;
/* The shadow backends compare() makes write kept bounds on the host (shadow.bounds_on_host). */
static int run_bounds_on_host;

/* The last run's policy description (SentKV's tokens attended and reuse rate, counted from its
 * choices wherever they were made). */
static char last_describe[512];

/* Prefill (chunks of 48 tokens) and STEPS greedy decode steps under spec; the logits of each. */
static float *run(const model *m, be_backend *b, const char *spec)
{
    char err[512];
    size_t n;
    int32_t *ids = prompt(m, &n);
    fwd_opts fo = { 2048, 48, run_page };
    int nv = m->hp.n_vocab;
    float *all = malloc(sizeof(float) * (size_t)nv * (STEPS + 1));
    pol_set *ps;
    fwd_ctx *f = fwd_fixture_start(m, b, &fo, spec, &ps, ids, n, all);
    for (int s = 1; s <= STEPS; s++) {
        const float *l = all + (size_t)(s - 1) * nv;
        int32_t best = samp_argmax(l, nv);
        cr_assert(fwd_decode(f, best, all + (size_t)s * nv, NULL, err, sizeof err) == 0, "%s", err);
    }
    memset(&last_stats, 0, sizeof last_stats);
    n_last_pages = 0;
    n_last_map = 0;
    last_describe[0] = 0;
    if (ps) {
        last_stats = *pol_set_stats(ps);
        pol_set_describe(ps, last_describe, sizeof last_describe);
        int np;
        const int *pg = pol_set_last_pages(ps, &np);
        n_last_pages = np < 256 ? np : 256;
        if (n_last_pages) memcpy(last_pages, pg, sizeof(int) * (size_t)n_last_pages);
        int64_t nm;
        const int64_t *map = pol_set_page_map(ps, &nm);
        cr_assert(nm <= 512, "a page map of %lld pages", (long long)nm);
        n_last_map = nm;
        if (nm) memcpy(last_map, map, sizeof(int64_t) * (size_t)nm);
    }
    pol_set_free(ps);
    fwd_free(f);
    free(ids);
    return all;
}

/* bound_pages calls in the last compare's last decode step on the shadow backend, and of them
 * those that waited. */
static int last_bounds, last_bound_waits;

/* How the shadow backend's logits compare with the CPU backend's: identical to the bit (decode
 * steps that wait a layer); within 1e-5 of the largest, every step's top token the same (steps
 * that defer their K/V rows, as no policy or a selection lets them: a step attends to its own row
 * as a page of its own, which changes the order of the softmax's sums); or only the top tokens and
 * finite logits (deferred steps over pages of a few tokens: there the extra page also changes how
 * the CPU's decode attention splits its list, a split per 4 pages, and the tiny random models turn
 * that into up to 0.5% of the largest logit; the same runs without splits are bit-identical). */
enum { CMP_DEFERRED, CMP_EXACT, CMP_SPLITS };

/* The shadow backend against the CPU backend under spec, compared as `how` says; either way the
 * steps attend to the same pages (statistics and page map). */
static void compare(const char *file, const char *spec, int how)
{
    int exact = how == CMP_EXACT;
    char err[512];
    model *m;
    cr_assert(model_load(&m, file, NULL, err, sizeof err) == 0, "%s", err);
    be_backend *cpu = be_cpu_create(2, err, sizeof err);
    be_backend *shd = shadow_create();
    sh(shd)->bounds_on_host = run_bounds_on_host;
    float *a = run(m, cpu, spec);
    pol_step_stats sa = last_stats;
    int pa[256], npa = n_last_pages;
    memcpy(pa, last_pages, sizeof pa);
    int64_t ma[512], nma = n_last_map;
    memcpy(ma, last_map, sizeof ma);
    char da[512];
    memcpy(da, last_describe, sizeof da);
    float *s = run(m, shd, spec);
    cr_expect_str_eq(da, last_describe, "%s under %s: the policy describes itself differently", file,
                     spec ? spec : "no policy");
    /* a deferred step reports what the cache would have shown with its token in it */
    cr_expect(sa.pages_sum == last_stats.pages_sum && sa.pages_total_sum == last_stats.pages_total_sum &&
                  sa.bytes_touched_total == last_stats.bytes_touched_total && sa.tokens_last == last_stats.tokens_last,
              "%s under %s: step statistics differ (pages %lld vs %lld of %lld vs %lld, bytes %llu vs %llu)", file,
              spec ? spec : "no policy", (long long)sa.pages_sum, (long long)last_stats.pages_sum,
              (long long)sa.pages_total_sum, (long long)last_stats.pages_total_sum,
              (unsigned long long)sa.bytes_touched_total, (unsigned long long)last_stats.bytes_touched_total);
    cr_expect(npa == n_last_pages && !memcmp(pa, last_pages, sizeof(int) * (size_t)npa),
              "%s under %s: the last step's pages differ", file, spec ? spec : "no policy");
    cr_expect(nma == n_last_map && !memcmp(ma, last_map, sizeof(int64_t) * (size_t)nma),
              "%s under %s: the steps' page map differs", file, spec ? spec : "no policy");
    int nv = m->hp.n_vocab;
    size_t n = (size_t)nv * (STEPS + 1);
    size_t bad = 0;
    double worst = 0, big = 0;
    for (size_t i = 0; i < n; i++) {
        bad += memcmp(&a[i], &s[i], sizeof(float)) != 0;
        double d = fabs((double)a[i] - s[i]);
        if (d > worst || isnan(d)) worst = isnan(d) ? INFINITY : d;
        if (fabs(a[i]) > big) big = fabs(a[i]);
    }
    /* the prompt's chunks run their layers without the host where no policy looks between them,
     * attending to their own rows after the pages: the CPU's blocked attention sums the same keys
     * the same way whatever pages hold them, so the prefill's logits are the same bits either way */
    cr_expect(!memcmp(a, s, sizeof(float) * (size_t)nv), "%s under %s: the prefill's logits differ", file,
              spec ? spec : "no policy");
    if (exact) {
        cr_expect_eq(bad, 0, "%s under %s: %zu of %zu logits differ with activations on the twin", file,
                     spec ? spec : "no policy", bad, n);
    } else {
        cr_expect(how == CMP_SPLITS ? isfinite(worst) : worst <= 1e-5 * big, "%s under %s: logits differ by %g of the largest with the K/V rows deferred",
                  file, spec ? spec : "no policy", worst / big);
        for (int st = 0; st <= STEPS; st++) {
            const float *x = a + (size_t)st * nv, *y = s + (size_t)st * nv;
            cr_expect_eq(samp_argmax(x, nv), samp_argmax(y, nv), "%s under %s: step %d's top token differs", file,
                         spec ? spec : "no policy", st);
        }
    }
    /* the last decode step read from the device once a layer, or once in all when its K/V rows were
     * deferred; it waited only for those reads and for its bounds (a selection's on the device) */
    cr_expect_eq(sh(shd)->reads, exact ? m->hp.n_layer : 1, "%s under %s: %d host reads in the last step", file,
                 spec ? spec : "no policy", sh(shd)->reads);
    cr_expect_eq(sh(shd)->waits, sh(shd)->reads + sh(shd)->bound_waits,
                 "%s under %s: %d waits for %d reads and %d bounds that waited", file, spec ? spec : "no policy",
                 sh(shd)->waits, sh(shd)->reads, sh(shd)->bound_waits);
    last_bounds = sh(shd)->bounds;
    last_bound_waits = sh(shd)->bound_waits;
    free(a);
    free(s);
    be_free(cpu);
    be_free(shd);
    model_free(m);
}

Test(residency, gemma3_logits_are_identical_on_twins)
{
    compare(TD "tiny/tiny-gemma3-q4_k_m.gguf", NULL, CMP_DEFERRED);
    compare(TD "tiny/tiny-gemma3-q4_k_m.gguf", "chelsea", CMP_EXACT);
}

Test(residency, llama_logits_are_identical_on_twins)
{
    compare(TD "tiny/tiny-llama-q4_k_m.gguf", "full", CMP_DEFERRED);
    compare(TD "tiny/tiny-llama-q4_k_m.gguf", "h2o:budget=0.3", CMP_EXACT);
}

/* A selection lists the pages without the step's own row, which the cache takes after the last
 * layer: the same pages as with the row in the cache (Quest counts the page the row will open
 * among those it bounds), no wait a layer for the rows. Quest's best pages stay on the device for
 * attention (no wait for them; the step's statistics read them at its end), and so does SentKV's
 * choice of segments, as bitmaps of positions. */
Test(residency, a_decode_step_under_a_selection_defers_its_rows)
{
    compare(TD "tiny/tiny-gemma3-q4_k_m.gguf", "chess:preset=aggressive,window=1", CMP_DEFERRED);
    cr_expect_eq(last_bounds, 0, "CHESS bounded pages %d times in a step", last_bounds);
    compare(TD "tiny/tiny-llama-q4_k_m.gguf", "streaming:budget=40", CMP_DEFERRED);
    compare(TD "tiny/tiny-gemma3-q4_k_m.gguf", "sentkv:budget=60,len=6,delta=3", CMP_DEFERRED);
    cr_expect(last_bounds > 0 && last_bound_waits == 0, "SentKV's last step: %d bounds calls, %d waited",
              last_bounds, last_bound_waits);
    compare(TD "tiny/tiny-llama-q4_k_m.gguf", "sentkv:budget=50,len=5,delta=2,sinks=3", CMP_DEFERRED);
    cr_expect(last_bounds > 0 && last_bound_waits == 0, "SentKV's last step on 2 KV heads: %d bounds calls, %d waited",
              last_bounds, last_bound_waits);
    /* its choice written on the host and announced (a device without room for the summaries) */
    run_bounds_on_host = 1;
    compare(TD "tiny/tiny-gemma3-q4_k_m.gguf", "sentkv:budget=60,len=6,delta=3", CMP_DEFERRED);
    run_bounds_on_host = 0;
    compare(TD "tiny/tiny-gemma3-q4_k_m.gguf", "quest:budget=24", CMP_DEFERRED);
    cr_expect(last_bounds > 0 && last_bound_waits == 0, "Quest's last step: %d bounds calls, %d waited", last_bounds,
              last_bound_waits);
    /* the best written on the host and announced (a device without room for the summaries) */
    run_bounds_on_host = 1;
    compare(TD "tiny/tiny-llama-q4_k_m.gguf", "quest:budget=24", CMP_DEFERRED);
    run_bounds_on_host = 0;
    cr_expect_gt(last_bounds, 0, "Quest bounded no pages with its best written on the host");
    /* pages of 3 and 8: steps whose row opens a page (then Quest bounds the page before it too) */
    run_page = 3;
    compare(TD "tiny/tiny-gemma3-q4_k_m.gguf", NULL, CMP_SPLITS);
    compare(TD "tiny/tiny-llama-q4_k_m.gguf", "quest:budget=6", CMP_SPLITS);
    compare(TD "tiny/tiny-gemma3-q4_k_m.gguf", "quest:budget=12", CMP_SPLITS);
    compare(TD "tiny/tiny-llama-q4_k_m.gguf", "streaming:budget=8,sinks=2", CMP_SPLITS);
    /* a recent window of the step's own token alone: the page it goes into is attended for it only */
    compare(TD "tiny/tiny-gemma3-q4_k_m.gguf", "streaming:budget=3,sinks=2", CMP_SPLITS);
    run_page = 8;
    compare(TD "tiny/tiny-gemma3-q4_k_m.gguf", "sentkv:budget=30,len=6,delta=3", CMP_SPLITS);
    compare(TD "tiny/tiny-llama-q4_k_m.gguf", "chess:preset=aggressive,window=1", CMP_SPLITS);
    run_page = 16;
    compare(TD "tiny/tiny-llama-q4_k_m.gguf", "take:budget=0.5+chess", CMP_DEFERRED);
    compare(TD "tiny/tiny-gemma3-q4_k_m.gguf", "snapkv:budget=0.3+quest:budget=40", CMP_DEFERRED);
}

/* Prefill, STEPS decode steps under spec1, then the policy swapped for spec2 (the first set freed,
 * as a live /policy switch does) and STEPS more: spec2's statistics and the logits of its steps. */
static float *run_switched(const model *m, be_backend *b, const char *spec1, const char *spec2, pol_step_stats *st)
{
    char err[512];
    size_t n;
    int32_t *ids = prompt(m, &n);
    fwd_opts fo = { 2048, 48, run_page };
    int nv = m->hp.n_vocab;
    float *l = malloc(sizeof(float) * (size_t)nv), *all = malloc(sizeof(float) * (size_t)nv * STEPS);
    pol_set *ps;
    fwd_ctx *f = fwd_fixture_start(m, b, &fo, spec1, &ps, ids, n, l);
    for (int s = 0; s < STEPS; s++)
        cr_assert(fwd_decode(f, samp_argmax(l, nv), l, NULL, err, sizeof err) == 0, "%s", err);
    pol_set *ps2 = fwd_fixture_policy_make(f, spec2);
    fwd_set_policy(f, ps2);
    pol_set_free(ps);
    for (int s = 0; s < STEPS; s++) {
        cr_assert(fwd_decode(f, samp_argmax(l, nv), l, NULL, err, sizeof err) == 0, "%s", err);
        memcpy(all + (size_t)s * nv, l, sizeof(float) * (size_t)nv);
    }
    *st = *pol_set_stats(ps2);
    pol_set_free(ps2);
    fwd_free(f);
    free(ids);
    free(l);
    return all;
}

/* A policy switched in after SentKV counts only its own selections: the forward pass's record of a
 * step's kept selections (its slots reused from step to step) once kept SentKV's choice of tokens
 * in a slot Quest's best then filled, so Quest's steps were counted through SentKV's freed page
 * spans (found by ASan under the stand-in CUDA runtime, bench/standin/). On the shadow backend
 * both choices stay on the device, as on a GPU; the CPU's counts are the reference. */
Test(residency, a_policy_switched_in_after_sentkv_counts_only_its_own_pages)
{
    static const char *const files[] = { TD "tiny/tiny-gemma3-q4_k_m.gguf", TD "tiny/tiny-llama-q4_k_m.gguf" };
    static const char *const pairs[][2] = { { "sentkv:budget=60,len=6,delta=3", "quest:budget=24" },
                                            { "sentkv:budget=50,len=5,delta=2", "chess:preset=aggressive,window=1" },
                                            { "quest:budget=24", "sentkv:budget=60,len=6,delta=3" } };
    for (int fi = 0; fi < 2; fi++) {
        char err[512];
        model *m;
        cr_assert(model_load(&m, files[fi], NULL, err, sizeof err) == 0, "%s", err);
        for (int pi = 0; pi < 3; pi++) {
            be_backend *cpu = be_cpu_create(2, err, sizeof err), *shd = shadow_create();
            pol_step_stats sa, sb;
            float *a = run_switched(m, cpu, pairs[pi][0], pairs[pi][1], &sa);
            float *b = run_switched(m, shd, pairs[pi][0], pairs[pi][1], &sb);
            cr_expect(sa.steps == sb.steps && sa.pages_sum == sb.pages_sum && sa.pages_total_sum == sb.pages_total_sum &&
                          sa.bytes_touched_total == sb.bytes_touched_total && sa.tokens_last == sb.tokens_last,
                      "%s, %s then %s: step statistics differ (pages %lld vs %lld of %lld vs %lld, tokens %lld vs %lld)",
                      files[fi], pairs[pi][0], pairs[pi][1], (long long)sa.pages_sum, (long long)sb.pages_sum,
                      (long long)sa.pages_total_sum, (long long)sb.pages_total_sum, (long long)sa.tokens_last,
                      (long long)sb.tokens_last);
            int nv = m->hp.n_vocab;
            for (int s = 0; s < STEPS; s++)
                cr_expect_eq(samp_argmax(a + (size_t)s * nv, nv), samp_argmax(b + (size_t)s * nv, nv),
                             "%s, %s then %s: step %d's top token differs", files[fi], pairs[pi][0], pairs[pi][1], s);
            free(a);
            free(b);
            be_free(cpu);
            be_free(shd);
        }
        model_free(m);
    }
}

Test(residency, policies_that_read_queries_on_the_host_see_them)
{
    /* TAKE reads probe rows after each chunk; H2O and SnapKV score queries in layer_done; Chelsea
     * merges keys and adds log-degree biases (H2O and Chelsea act while decoding too: their steps
     * wait a layer) */
    compare(TD "tiny/tiny-llama-q4_k_m.gguf", "take:budget=0.5", CMP_DEFERRED);
    compare(TD "tiny/tiny-gemma3-q4_k_m.gguf", "h2o:budget=0.3", CMP_EXACT);
    compare(TD "tiny/tiny-gemma3-q4_k_m.gguf", "snapkv:budget=0.3", CMP_DEFERRED);
    compare(TD "tiny/tiny-llama-q4_k_m.gguf", "chelsea", CMP_EXACT);
    compare(TD "tiny/tiny-llama-q4_k_m.gguf", "laser:budget=0.5", CMP_DEFERRED);   /* its probe's rows only */
}

/* A prefill's queries come back to the host only for a policy that reads them there: under "full"
 * (no layer_done, no selection) the host reads what it reads with no policy at all, the K/V rows,
 * and so it does under SentKV and Chelsea, whose layer_done reads keys only (pol_ops.query_rows);
 * H2O scores queries after each layer and reads more. (That every policy that reads them gets them
 * is policies_that_read_queries_on_the_host_see_them.) */
Test(residency, queries_come_back_only_where_a_policy_reads_them)
{
    char err[512];
    model *m;
    cr_assert(model_load(&m, TD "tiny/tiny-llama-q4_k_m.gguf", NULL, err, sizeof err) == 0, "%s", err);
    be_backend *shd = shadow_create();
    static const char *const specs[] = { NULL, "full", "h2o:budget=0.3", "sentkv", "chelsea" };
    uint64_t bytes[5];
    for (int i = 0; i < 5; i++) {
        sh(shd)->bytes_read = 0;
        free(run(m, shd, specs[i]));
        bytes[i] = sh(shd)->bytes_read;
    }
    cr_expect(bytes[0] > 0);
    cr_expect_eq(bytes[1], bytes[0], "under full the host read %llu bytes, with no policy %llu",
                 (unsigned long long)bytes[1], (unsigned long long)bytes[0]);
    cr_expect_gt(bytes[2], bytes[0], "H2O's queries were not read");
    for (int i = 3; i < 5; i++)   /* a layer_done that reads no query: the rows, a layer at a time */
        cr_expect_eq(bytes[i], bytes[0], "under %s the host read %llu bytes, with no policy %llu", specs[i],
                     (unsigned long long)bytes[i], (unsigned long long)bytes[0]);
    be_free(shd);
    model_free(m);
}

/* A forward context of m on a fresh shadow backend under spec, with the prompt and a row of logits. */
typedef struct on_shadow {
    be_backend *shd;
    fwd_ctx *f;
    pol_set *ps;
    int32_t *ids;
    size_t n;
    float *l;
} on_shadow;

/* A forward context of chunks of batch tokens on a shadow device that refuses binds of refuse_bytes
 * (0: none), the prompt and spec's policies. */
static void shadow_open_refusing(on_shadow *o, const model *m, const char *spec, int batch, size_t refuse_bytes)
{
    char err[512];
    o->shd = shadow_create();
    sh(o->shd)->refuse_bytes = refuse_bytes;
    o->ids = prompt(m, &o->n);
    fwd_opts fo = { 2048, batch, 16 };
    o->f = fwd_create(m, o->shd, &fo, err, sizeof err);
    cr_assert(o->f, "%s", err);
    o->ps = fwd_fixture_policy(o->f, spec);
    o->l = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
    cr_assert(o->l);
}

static void shadow_open(on_shadow *o, const model *m, const char *spec, int batch)
{
    shadow_open_refusing(o, m, spec, batch, 0);
}

static void shadow_close(on_shadow *o)
{
    free(o->l);
    free(o->ids);
    pol_set_free(o->ps);
    fwd_free(o->f);
    be_free(o->shd);
}

/* A prompt's chunk waits for the device once where no policy looks between its layers (none,
 * full, a selection: Quest, CHESS), the cache taking every layer's rows after the last; and once a
 * layer where one does (H2O scores each global layer's queries, TAKE evicts after them). */
Test(residency, a_prefill_chunk_waits_once_where_no_policy_looks_between_layers)
{
    char err[512];
    static const struct { const char *file, *spec; int free; } runs[] = {
        { TD "tiny/tiny-llama-q4_k_m.gguf", NULL, 1 },
        { TD "tiny/tiny-gemma3-q4_k_m.gguf", "full", 1 },
        { TD "tiny/tiny-llama-q4_k_m.gguf", "quest:budget=64", 1 },
        { TD "tiny/tiny-gemma3-q4_k_m.gguf", "chess:preset=aggressive,window=1", 1 },
        { TD "tiny/tiny-gemma3-q4_k_m.gguf", "h2o:budget=0.3", 0 },
        { TD "tiny/tiny-llama-q4_k_m.gguf", "take:budget=0.5", 0 },
    };
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        model *m;
        cr_assert(model_load(&m, runs[i].file, NULL, err, sizeof err) == 0, "%s", err);
        on_shadow o;
        shadow_open(&o, m, runs[i].spec, 32);
        cr_assert(o.n > 2 * 32, "the prompt fills %zu tokens: not three chunks", o.n);
        /* a prompt of one chunk, then one of two (the first asks for no logits) */
        sh(o.shd)->reads_all = 0;
        cr_assert(fwd_eval(o.f, o.ids, 32, NULL, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
        int first = sh(o.shd)->reads_all;
        sh(o.shd)->reads_all = 0;
        cr_assert(fwd_eval(o.f, o.ids + 32, (int64_t)o.n - 32, o.l, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0,
                  "%s", err);
        int second = sh(o.shd)->reads_all;
        const char *what = runs[i].spec ? runs[i].spec : "no policy";
        cr_expect_eq(fwd_pos(o.f), (int64_t)o.n, "under %s the cache holds %lld of %zu tokens", what,
                     (long long)fwd_pos(o.f), o.n);
        if (runs[i].free) {
            cr_expect(first == 1 && second == 2, "under %s prompts of one and two chunks read from the device %d and "
                      "%d times", what, first, second);
        } else {
            cr_expect(first >= m->hp.n_layer / 2 && second >= m->hp.n_layer,
                      "under %s prompts of one and two chunks read from the device only %d and %d times", what, first,
                      second);
        }
        shadow_close(&o);
        model_free(m);
    }
}

/* A prompt's K/V rows, taken into the cache a chunk at a time (after the chunk where no policy
 * looks between layers, else a layer at a time), are named to the backend page by page, every row
 * of every KV head of every layer (the shadow checks each against its page), so that a device
 * writes them into its copies itself; a decode step's are not. An eviction's fresh pages are named
 * with the rows they came from (each checked against both pages). */
Test(residency, a_prompts_rows_are_named_to_the_device_page_by_page)
{
    char err[512];
    static const struct { const char *file, *spec; int exact, evicts; } runs[] = {
        { TD "tiny/tiny-llama-q4_k_m.gguf", NULL, 1, 0 },
        { TD "tiny/tiny-gemma3-q4_k_m.gguf", "full", 1, 0 },
        { TD "tiny/tiny-gemma3-q4_k_m.gguf", "chess:preset=aggressive,window=1", 1, 0 },
        { TD "tiny/tiny-llama-q4_k_m.gguf", "take:budget=0.5", 0, 1 },
        { TD "tiny/tiny-gemma3-q4_k_m.gguf", "h2o:budget=0.3", 1, 1 },
        { TD "tiny/tiny-llama-q4_k_m.gguf", "snapkv:budget=0.3", 1, 1 },
    };
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        model *m;
        cr_assert(model_load(&m, runs[i].file, NULL, err, sizeof err) == 0, "%s", err);
        on_shadow o;
        shadow_open(&o, m, runs[i].spec, 32);
        const int64_t n = (int64_t)o.n - (int64_t)o.n % 32 + (o.n % 32 == 1 ? -32 : 0);   /* chunks of 2 or more */
        cr_assert(fwd_eval(o.f, o.ids, n, o.l, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
        const int64_t per_token = (int64_t)m->hp.n_layer * m->hp.n_head_kv, named = sh(o.shd)->rows_named;
        const char *what = runs[i].spec ? runs[i].spec : "no policy";
        if (runs[i].exact)
            cr_expect_eq(named, n * per_token, "under %s %lld rows named, of %lld", what, (long long)named,
                         (long long)(n * per_token));
        else   /* TAKE's chunks are its own: at least all but its last */
            cr_expect(named >= (n - 128) * per_token && named <= n * per_token, "under %s %lld rows named, of %lld",
                      what, (long long)named, (long long)(n * per_token));
        int32_t tok = o.ids[n];
        cr_assert(fwd_eval(o.f, &tok, 1, o.l, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
        tok = o.ids[n + 1];
        cr_assert(fwd_eval(o.f, &tok, 1, o.l, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
        cr_expect_eq(sh(o.shd)->rows_named, named, "under %s a decode step's rows were named", what);
        /* an eviction's fresh pages named with where their rows came from (each checked) */
        if (runs[i].evicts)
            cr_expect(sh(o.shd)->pages_moved > 0 && sh(o.shd)->rows_moved >= sh(o.shd)->pages_moved,
                      "under %s no eviction's fresh page was named", what);
        else
            cr_expect_eq(sh(o.shd)->rows_moved, 0, "under %s rows were moved", what);
        shadow_close(&o);
        model_free(m);
    }
}

/* Model file loaded into *m, and the backend it runs on: the shadow device, or the CPU's (2 threads). */
static be_backend *model_on(const char *file, int device, model **m)
{
    char err[512];
    cr_assert(model_load(m, file, NULL, err, sizeof err) == 0, "%s", err);
    be_backend *b = device ? shadow_create() : be_cpu_create(2, err, sizeof err);
    cr_assert(b, "%s", err);
    return b;
}

/* A chunk's rows of every layer (chunks of batch tokens), as one of the four buffers a context's
 * deferred rows wait in holds them: the size a shadow refuses to leave the context without them. */
static size_t row_buffer_bytes(const model *m, int batch)
{
    return sizeof(float) * (size_t)m->hp.n_layer * (size_t)batch * (size_t)m->hp.n_head_kv * (size_t)m->hp.head_dim;
}

/* A context grows the buffers a chunk's rows wait in as it is made; where the device has no room for
 * them the chunks wait a layer at a time, with the same answer, and nothing is said. */
Test(residency, a_prompt_whose_row_buffers_do_not_fit_waits_a_layer_at_a_time)
{
    char err[512];
    model *m;
    be_backend *cpu = model_on(TD "tiny/tiny-gemma3-q4_k_m.gguf", 0, &m);
    float *want = run(m, cpu, NULL);
    on_shadow o;
    shadow_open_refusing(&o, m, NULL, 48, row_buffer_bytes(m, 48));
    sh(o.shd)->reads_all = 0;
    cr_assert(fwd_eval(o.f, o.ids, (int64_t)o.n, o.l, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    cr_expect_geq(sh(o.shd)->reads_all, 2 * m->hp.n_layer, "%d reads for a prompt of two chunks", sh(o.shd)->reads_all);
    cr_expect(!memcmp(o.l, want, sizeof(float) * (size_t)m->hp.n_vocab), "the prefill's logits differ");
    /* decode steps still defer, in the one-row buffers bound at creation */
    cr_assert(fwd_decode(o.f, samp_argmax(o.l, m->hp.n_vocab), o.l, NULL, err, sizeof err) == 0, "%s", err);
    cr_expect_eq(sh(o.shd)->reads, 1, "the decode step read %d times", sh(o.shd)->reads);
    shadow_close(&o);
    free(want);
    be_free(cpu);
    model_free(m);
}

/* A context made where the device had no room for its row buffers (beside the one it replaces)
 * grows them at its first chunk once there is: that prompt defers (a read a chunk, not a layer),
 * with the CPU's answer; where there is still none, it waits a layer at a time, as above. */
Test(residency, row_buffers_without_room_at_creation_grow_at_the_first_chunk)
{
    char err[512];
    model *m;
    be_backend *cpu = model_on(TD "tiny/tiny-llama-q4_k_m.gguf", 0, &m);
    float *want = run(m, cpu, NULL);
    on_shadow o;
    shadow_open_refusing(&o, m, NULL, 48, row_buffer_bytes(m, 48));
    shadow *s = sh(o.shd);
    s->refuse_bytes = 0;   /* the room is there now */
    s->reads_all = 0;
    int binds = s->binds;
    cr_assert(fwd_eval(o.f, o.ids, (int64_t)o.n, o.l, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    cr_expect_eq(s->binds - binds, 4, "%d buffers bound at the first chunk, 4 expected", s->binds - binds);
    cr_expect_lt(s->reads_all, m->hp.n_layer, "%d reads for a prompt of two chunks: it waited a layer at a time",
                 s->reads_all);
    cr_expect(!memcmp(o.l, want, sizeof(float) * (size_t)m->hp.n_vocab), "the prefill's logits differ");
    shadow_close(&o);
    free(want);
    be_free(cpu);
    model_free(m);
}

/* A device's first prompt costs it what a later one does: the context binds what its chunks use
 * when it is made (locking a 7B's row buffers took the first prompt 120 ms on an H200), and a
 * buffer's first write by an op sends nothing of the host's (its bytes mean nothing yet). A second
 * prompt after a rewind is the yardstick: it binds nothing either and sends only what it must. */
Test(residency, a_first_prompt_binds_nothing_and_sends_no_more_than_a_later_one)
{
    char err[512];
    static const char *const files[] = { TD "tiny/tiny-gemma3-q4_k_m.gguf", TD "tiny/tiny-llama-q4_k_m.gguf" };
    for (size_t fi = 0; fi < sizeof files / sizeof *files; fi++) {
        model *m;
        cr_assert(model_load(&m, files[fi], NULL, err, sizeof err) == 0, "%s", err);
        on_shadow o;
        shadow_open(&o, m, NULL, 32);   /* 88 tokens: three chunks */
        shadow *s = sh(o.shd);
        uint64_t up[2], binds[2];
        for (int pass = 0; pass < 2; pass++) {
            cr_assert(fwd_rewind(o.f, 0) == 0);
            binds[pass] = (uint64_t)s->binds;
            up[pass] = s->t.up_bytes;
            cr_assert(fwd_eval(o.f, o.ids, (int64_t)o.n, o.l, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0,
                      "%s", err);
            cr_assert(fwd_decode(o.f, samp_argmax(o.l, m->hp.n_vocab), o.l, NULL, err, sizeof err) == 0, "%s", err);
            binds[pass] = (uint64_t)s->binds - binds[pass];
            up[pass] = s->t.up_bytes - up[pass];
        }
        cr_expect_eq(binds[0], 0, "%s: the first prompt bound %llu buffers", files[fi], (unsigned long long)binds[0]);
        cr_expect_eq(binds[1], 0, "%s: the second prompt bound %llu buffers", files[fi], (unsigned long long)binds[1]);
        cr_expect_leq(up[0], up[1], "%s: the first prompt and step sent %llu bytes up, a later one %llu", files[fi],
                      (unsigned long long)up[0], (unsigned long long)up[1]);
        shadow_close(&o);
        model_free(m);
    }
}

Test(residency, chess_scores_its_kept_summaries_on_the_twins)
{
    /* CHESS with its summaries bound to the shadow device, against CHESS on the CPU backend over
     * the same cache (two global layers of two KV heads, random keys, pages of 4): at each of 300
     * steps, through growth past several doublings of its buffers and a rewind, the choice is the
     * same; the rows and the anchor are computed on the twins (key_means) bound blank, so no
     * step sends anything up, not even when a matrix grew; freeing the set leaves nothing bound. */
    enum { HK = 2, NL = 2, DIM = 8 };
    char err[512];
    be_backend *dev = shadow_create(), *cpu = be_cpu_create(1, err, sizeof err);
    cr_assert(cpu, "%s", err);
    kv_cache *kv = kv_create(NL, 4096, HK, DIM, 4, NULL, err, sizeof err);
    cr_assert(kv, "%s", err);
    int global[NL] = { 0, 1 };
    pol_env on_dev = { kv, dev, HK, HK, DIM, global, NL, NULL, 0, NULL, NULL, NULL, NULL, 0, NULL, NULL }, on_cpu = on_dev;
    on_cpu.b = cpu;
    pol_spec spec;
    cr_assert(pol_parse(&spec, "chess:sink=1,window=1,anchor=4,chunk=2,grid=2,rho_g=0.5,rho_c=0.5,rho_p=0.5", NULL, err,
                        sizeof err) == 0, "%s", err);
    pol_set *a = pol_set_create(&spec, &on_dev, err, sizeof err), *c = pol_set_create(&spec, &on_cpu, err, sizeof err);
    cr_assert(a && c, "%s", err);
    uint64_t r = 0xC4E55;
    int sent = 0;
    for (int step = 0; step < 300; step++) {
        if (step == 150) kv_rewind(kv, kv_len(kv) - 30);
        fwd_fixture_random_keys(kv, NL, step == 0 ? 40 : 1, &r);
        int64_t pos = kv_len(kv) - 1;
        char got[1024], want[1024];
        uint64_t up0 = sh(dev)->t.up_bytes;
        fwd_fixture_choice(a, pos, got, sizeof got);
        uint64_t up = sh(dev)->t.up_bytes - up0;
        fwd_fixture_choice(c, pos, want, sizeof want);
        cr_assert_str_eq(got, want, "step %d: the choice on the twins differs from the CPU's", step);
        sent += up > 0;
    }
    cr_expect_eq(sent, 0, "%d of 300 steps sent something up", sent);
    pol_set_free(a);
    cr_expect_eq(sh(dev)->t.n, 0, "%d buffers left bound", sh(dev)->t.n);
    pol_set_free(c);
    kv_free(kv);
    be_free(cpu);
    be_free(dev);
}

Test(residency, a_failed_device_op_is_an_error_and_leaves_the_cache_as_it_was)
{
    char err[512];
    model *m;
    cr_assert(model_load(&m, TD "tiny/tiny-gemma3-q4_k_m.gguf", NULL, err, sizeof err) == 0, "%s", err);
    /* what an undisturbed run on the same backend gives */
    be_backend *clean = shadow_create();
    float *want = run(m, clean, NULL);
    be_free(clean);
    be_backend *shd = shadow_create();
    size_t n;
    int32_t *ids = prompt(m, &n);
    fwd_opts fo = { 2048, 48, 16 };
    fwd_ctx *f = fwd_create(m, shd, &fo, err, sizeof err);
    cr_assert(f, "%s", err);
    int nv = m->hp.n_vocab;
    float *l = malloc(sizeof(float) * (size_t)nv);
    /* fail in the middle of the prompt's second chunk (a chunk: the embedding, the first norm and
     * every layer's ops), then in the last product of a decode step */
    int L = m->hp.n_layer;
    cr_assert_gt((int64_t)n, fo.n_batch, "the prompt fills one chunk only");
    sh(shd)->fail_at = sh(shd)->ops + (2 + LAYER_OPS * L) + 2 + LAYER_OPS * L / 2;
    cr_expect_eq(fwd_eval(f, ids, (int64_t)n, l, NULL, NULL, NULL, NULL, NULL, err, sizeof err), -1);
    cr_expect(strstr(err, "out of shadow device memory") != NULL, "message: %s", err);
    cr_expect_eq(fwd_pos(f), 0, "the failed prefill left %lld tokens in the cache", (long long)fwd_pos(f));
    cr_assert(fwd_eval(f, ids, (int64_t)n, l, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    cr_expect(!memcmp(l, want, sizeof(float) * (size_t)nv), "the retried prefill's logits differ");
    int32_t best = samp_argmax(l, nv);
    sh(shd)->fail_at = sh(shd)->ops + 2 + LAYER_OPS * L + 2;   /* after the final norm: the output product */
    cr_expect_eq(fwd_decode(f, best, l, NULL, err, sizeof err), -1);
    cr_expect_eq(fwd_pos(f), (int64_t)n, "the failed step left its token in the cache");
    /* a Ctrl-C right after a failed op: the failure is what is reported, and it does not linger
     * into the next call */
    static volatile sig_atomic_t cancel;
    cancel = 0;
    sh(shd)->cancel_too = &cancel;
    sh(shd)->fail_at = sh(shd)->ops + 30;
    cr_expect_eq(fwd_decode(f, best, l, &cancel, err, sizeof err), -1);
    cr_expect(strstr(err, "out of shadow device memory") != NULL, "a cancel hid the failure: %s", err);
    sh(shd)->cancel_too = NULL;
    int64_t ops0 = sh(shd)->ops;
    cr_assert(fwd_decode(f, best, l, NULL, err, sizeof err) == 0, "%s", err);
    cr_expect(!memcmp(l, want + nv, sizeof(float) * (size_t)nv), "the retried step's logits differ");
    cr_expect_eq(sh(shd)->ops - ops0, 2 + LAYER_OPS * L + 2, "a decode step ran %lld ops",
                 (long long)(sh(shd)->ops - ops0));
    free(l);
    free(ids);
    free(want);
    fwd_free(f);
    be_free(shd);
    model_free(m);
}

/* A decode step under Quest that fails on the device after some of its layers left their choice
 * there (a cancelled step leaves the same way): nothing of it is counted, then or at the next eval
 * (a prefill, which selects nothing, leaves the page map as it was). */
Test(residency, a_failed_step_leaves_no_statistics_behind)
{
    char err[512];
    model *m;
    cr_assert(model_load(&m, TD "tiny/tiny-llama-q4_k_m.gguf", NULL, err, sizeof err) == 0, "%s", err);
    on_shadow o;
    shadow_open(&o, m, "quest:budget=24", 48);
    cr_assert(fwd_eval(o.f, o.ids, (int64_t)o.n, o.l, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    int32_t tok = samp_argmax(o.l, m->hp.n_vocab);
    cr_assert(fwd_decode(o.f, tok, o.l, NULL, err, sizeof err) == 0, "%s", err);
    cr_assert_gt(sh(o.shd)->bounds, 0, "the step bounded no pages");
    int64_t nm, nm2, before[512];
    const int64_t *map = pol_set_page_map(o.ps, &nm);
    cr_assert(nm <= 512);
    memcpy(before, map, sizeof(int64_t) * (size_t)nm);
    int64_t steps = pol_set_stats(o.ps)->steps;
    /* the third layer's bounds (after the embedding, the first norm, two layers of LAYER_OPS and a
     * bounds op each, the third's q/k/v product and qk_rope) */
    sh(o.shd)->fail_at = sh(o.shd)->ops + 2 + 2 * (LAYER_OPS + 1) + 3;
    cr_expect_eq(fwd_decode(o.f, tok, o.l, NULL, err, sizeof err), -1);
    cr_expect_geq(sh(o.shd)->bounds, 2, "the failed step bounded pages %d times first", sh(o.shd)->bounds);
    map = pol_set_page_map(o.ps, &nm2);
    cr_expect(nm2 == nm && !memcmp(before, map, sizeof(int64_t) * (size_t)nm), "the failed step changed the page map");
    cr_expect_eq(pol_set_stats(o.ps)->steps, steps, "the failed step was recorded");
    int32_t more[5] = { tok, tok, tok, tok, tok };
    cr_assert(fwd_eval(o.f, more, 5, o.l, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    map = pol_set_page_map(o.ps, &nm2);
    cr_expect(nm2 >= nm && !memcmp(before, map, sizeof(int64_t) * (size_t)nm), "the prefill after it counted pages");
    for (int64_t i = nm; i < nm2; i++) cr_expect_eq(map[i], 0, "the prefill after it counted page %lld", (long long)i);
    shadow_close(&o);
    model_free(m);
}

/* Reads dropped: K/V rows read a layer at a time (H2O looks between layers) or a chunk at a time
 * (no policy: the next chunk takes them; the embedding written on the twin, so that no write of the
 * host's waits for the device by chance) come from spoiled host copies. */
Test(residency, a_forgotten_host_read_is_caught)
{
    char err[512];
    model *m;
    cr_assert(model_load(&m, TD "tiny/tiny-llama-q4_k_m.gguf", NULL, err, sizeof err) == 0, "%s", err);
    static const char *const specs[] = { "h2o:budget=0.3", NULL };
    for (int i = 0; i < 2; i++) {
        on_shadow o;
        shadow_open(&o, m, specs[i], 48);
        sh(o.shd)->ignore_reads = 1;
        sh(o.shd)->gather_on_twin = 1;
        cr_assert(fwd_eval(o.f, o.ids, (int64_t)o.n, o.l, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s",
                  err);
        int nan = 0;
        for (int32_t t = 0; t < m->hp.n_vocab; t++) nan += isnan(o.l[t]);
        cr_expect_gt(nan, 0, "under %s K/V rows read without asking still gave finite logits",
                     specs[i] ? specs[i] : "no policy");
        shadow_close(&o);
    }
    model_free(m);
}

/* A decode step through the pick with its K/V rows deferred waits for the device once: the rows
 * are fetched at the end of the layers and come in with the pick's wait, before the cache takes
 * them; the embedding rows gathered on the twin (with them written on the host, the first step
 * after a prefill also brings back the prefill's other hidden rows first: two waits). The tokens are
 * the CPU backend's (greedy; the first from the prefill's logits). */
Test(residency, a_picked_decode_step_waits_for_the_device_once)
{
    char err[512];
    const char *files[2] = { TD "tiny/tiny-gemma3-q4_k_m.gguf", TD "tiny/tiny-llama-f16.gguf" };
    for (int fi = 0; fi < 2; fi++) {
        model *m;
        cr_assert(model_load(&m, files[fi], NULL, err, sizeof err) == 0, "%s", err);
        int32_t toks[3][STEPS + 1];
        for (int dev = 0; dev < 3; dev++) {
            be_backend *b = dev ? shadow_create() : be_cpu_create(2, err, sizeof err);
            cr_assert(b, "%s", err);
            if (dev == 2) sh(b)->gather_on_twin = 1;
            size_t n;
            int32_t *ids = prompt(m, &n);
            fwd_opts fo = { 2048, 48, 16 };
            fwd_ctx *f = fwd_create(m, b, &fo, err, sizeof err);
            cr_assert(f, "%s", err);
            float *l = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
            cr_assert(fwd_eval(f, ids, (int64_t)n, l, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
            toks[dev][0] = samp_argmax(l, m->hp.n_vocab);
            for (int s = 1; s <= STEPS; s++) {
                float val;
                int32_t id;
                be_pick p = { .penalty = 1.0f, .k = 1, .val = &val, .id = &id };
                cr_assert(fwd_decode_pick(f, toks[dev][s - 1], &p, NULL, err, sizeof err) == 0, "%s", err);
                cr_assert_eq(p.n_out, 1);
                toks[dev][s] = id;
                /* the embedding's write on the host first brings back the prefill's other hidden
                 * rows, which the act mirror cannot know the host will never read */
                if (dev)
                    cr_expect_eq(sh(b)->waits, s == 1 && dev == 1 ? 2 : 1, "%s step %d waited %d times (gather on "
                                 "the twin: %d)", files[fi], s, sh(b)->waits, dev == 2);
            }
            cr_expect_eq(fwd_pos(f), (int64_t)n + STEPS, "the cache holds every step's rows");
            free(l);
            free(ids);
            fwd_free(f);
            be_free(b);
        }
        cr_expect(!memcmp(toks[0], toks[1], sizeof toks[0]) && !memcmp(toks[0], toks[2], sizeof toks[0]),
                  "%s: the tokens differ on the twins", files[fi]);
        model_free(m);
    }
}

/* ---- batched decode steps (fwd_decode_batch) */

/* Fork s of a prefilled context under spec (adopting the prompt, as sess_compare's do), s steps
 * of id decoded into it alone: the forks of a batch stand at positions of their own. */
static fwd_ctx *fork_under(fwd_ctx *base, const char *spec, const int32_t *ids, size_t n, int s, int32_t id,
                           pol_set **ps)
{
    char err[512];
    fwd_ctx *f = fwd_fork(base, 1, err, sizeof err);
    cr_assert(f, "%s", err);
    *ps = spec ? fwd_fixture_policy_make(f, spec) : NULL;
    cr_assert(fwd_adopt_policy(f, *ps, ids, (int64_t)n, err, sizeof err) == 0, "%s", err);
    float *l = malloc(sizeof(float) * (size_t)fwd_model(f)->hp.n_vocab);
    for (int t = 0; t < s; t++) cr_assert(fwd_decode(f, id, l, NULL, err, sizeof err) == 0, "%s", err);
    free(l);
    return f;
}

/* A fork decoded alone gives, step by step, the bits of a context that read its prompt itself and
 * adopted the same policy (NULL: none): that its lists of every page (the engine's and CHESS's)
 * started as its source's, and that its shared last pages were copied on write, change nothing a
 * step computes. The steps cross a page boundary in every head. */
static void fork_vs_fresh(const char *file, int device, const char *spec)
{
    char err[512];
    model *m;
    be_backend *b = model_on(file, device, &m);
    size_t np;
    int32_t *ids = prompt(m, &np);
    fwd_opts fo = { 2048, 48, run_page };
    const int nv = m->hp.n_vocab;
    float *la = malloc(sizeof(float) * (size_t)nv), *lb = malloc(sizeof(float) * (size_t)nv);
    fwd_ctx *base = fwd_create(m, b, &fo, err, sizeof err), *fresh = fwd_create(m, b, &fo, err, sizeof err);
    cr_assert(base && fresh && la && lb, "%s", err);
    cr_assert(fwd_eval(base, ids, (int64_t)np, la, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    cr_assert(fwd_eval(fresh, ids, (int64_t)np, lb, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    pol_set *ps, *pf = spec ? fwd_fixture_policy_make(fresh, spec) : NULL;
    fwd_ctx *f = fork_under(base, spec, ids, np, 0, 0, &ps);
    cr_assert(fwd_adopt_policy(fresh, pf, ids, (int64_t)np, err, sizeof err) == 0, "%s", err);
    for (int t = 0; t < run_page + 3; t++) {
        const int32_t id = 3 + (int32_t)((t * 71 + 5) % (nv - 3));
        cr_assert(fwd_decode(f, id, la, NULL, err, sizeof err) == 0, "%s", err);
        cr_assert(fwd_decode(fresh, id, lb, NULL, err, sizeof err) == 0, "%s", err);
        cr_expect(!memcmp(la, lb, sizeof(float) * (size_t)nv), "%s (%s, %s) step %d: the fork's logits differ", file,
                  spec ? spec : "none", device ? "twins" : "cpu", t);
    }
    /* the fork's lists did start as its source's: the engine's (read by attention) with no policy
     * or Quest's (which attends its pages from that list), CHESS's own */
    if (device && spec && !strncmp(spec, "chess", 5))
        cr_expect_gt(sh(b)->means_from, 0, "%s: CHESS's lists of the fork were built whole", file);
    else if (device)
        cr_expect_gt(sh(b)->attn_from, 0, "%s (%s): the fork's lists were built whole", file, spec ? spec : "none");
    fwd_free(f);
    pol_set_free(ps);
    fwd_free(fresh);
    pol_set_free(pf);
    fwd_free(base);
    free(la);
    free(lb);
    free(ids);
    be_free(b);
    model_free(m);
}

Test(residency, a_fork_decodes_the_bits_of_a_context_that_read_its_prompt_alone)
{
    const char *specs[] = { NULL, "chess:preset=aggressive,window=1", "quest:budget=24" };
    const char *files[] = { TD "tiny/tiny-gemma3-q4_k_m.gguf", TD "tiny/tiny-llama-q4_k_m.gguf" };
    for (int fi = 0; fi < 2; fi++)
        for (int device = 0; device < 2; device++)
            for (int s = 0; s < 3; s++) fork_vs_fresh(files[fi], device, specs[s]);
}

/* n forks of one prefilled context, each under its spec (NULL: none), fork s decoded s steps alone
 * and then STEPS - s greedy steps alone (fwd_decode_pick, one fork at a time) and as one batch
 * (fwd_decode_batch: the forks at positions of their own, leaving it at their own steps): every
 * step's candidates, every fork's last row and its statistics are the same bits, and the
 * prefilled context's cache is untouched. */
/* max_waits >= 0: on the shadow device, a batch step past the first waits at most that often more
 * than the shadow's own (one for every sequence's pick together and one for the step's rows). */
static void batch_vs_alone(const char *file, int device, const char *const *specs, int n, int max_waits)
{
    char err[512];
    model *m;
    be_backend *b = model_on(file, device, &m);
    size_t np;
    int32_t *ids = prompt(m, &np);
    fwd_opts fo = { 2048, 48, run_page };
    fwd_ctx *base = fwd_create(m, b, &fo, err, sizeof err);
    cr_assert(base, "%s", err);
    int nv = m->hp.n_vocab;
    float *l0 = malloc(sizeof(float) * (size_t)nv), *row = malloc(sizeof(float) * (size_t)nv);
    cr_assert(fwd_eval(base, ids, (int64_t)np, l0, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    int32_t first = samp_argmax(l0, nv);
    int64_t len0 = fwd_pos(base);
    kv_stats st0;
    kv_get_stats(fwd_kv(base), &st0);
    /* alone: each fork's top candidate a step, and its last row */
    int32_t alone[FWD_BATCH_MAX][STEPS + 1];
    float *alone_row[FWD_BATCH_MAX];
    pol_step_stats alone_st[FWD_BATCH_MAX];
    for (int s = 0; s < n; s++) {
        pol_set *ps;
        fwd_ctx *f = fork_under(base, specs[s], ids, np, s, first, &ps);
        int32_t id = first;
        for (int t = 0; t < STEPS - s; t++) {
            float val[4];
            int32_t top[4];
            be_pick p = { .k = 4, .val = val, .id = top };
            cr_assert(fwd_decode_pick(f, id, &p, NULL, err, sizeof err) == 0, "%s", err);
            alone[s][t] = id = top[0];
        }
        alone_row[s] = malloc(sizeof(float) * (size_t)nv);
        cr_assert(fwd_picked_logits(f, alone_row[s], err, sizeof err) == 0, "%s", err);
        memset(&alone_st[s], 0, sizeof alone_st[s]);
        if (ps) alone_st[s] = *pol_set_stats(ps);
        fwd_free(f);
        pol_set_free(ps);
    }
    /* together (fork s's first s steps alone) */
    const int64_t moved0 = device ? sh(b)->pages_moved : 0;
    fwd_ctx *fs[FWD_BATCH_MAX];
    pol_set *pss[FWD_BATCH_MAX];
    int32_t cur[FWD_BATCH_MAX];
    for (int s = 0; s < n; s++) {
        fs[s] = fork_under(base, specs[s], ids, np, s, first, &pss[s]);
        cur[s] = first;
    }
    const int joined0 = device ? sh(b)->joined : 0;
    for (int t = 0; t < STEPS; t++) {
        fwd_ctx *in[FWD_BATCH_MAX];
        int32_t bid[FWD_BATCH_MAX];
        be_pick p[FWD_BATCH_MAX];
        float val[FWD_BATCH_MAX][4];
        int32_t top[FWD_BATCH_MAX][4];
        int who[FWD_BATCH_MAX], nb = 0;
        for (int s = 0; s < n; s++) {
            if (t >= STEPS - s) continue;
            in[nb] = fs[s];
            bid[nb] = cur[s];
            p[nb] = (be_pick){ .k = 4, .val = val[nb], .id = top[nb] };
            who[nb++] = s;
        }
        const int w0 = device ? sh(b)->waits_all : 0;
        cr_assert(fwd_decode_batch(base, in, nb, bid, NULL, p, NULL, err, sizeof err) == 0, "%s", err);
        if (device && t > 0 && max_waits >= 0)
            cr_expect_leq(sh(b)->waits_all - w0, 2 + max_waits, "%s step %d: %d waits for %d sequences", file, t,
                          sh(b)->waits_all - w0, nb);
        for (int j = 0; j < nb; j++) {
            int s = who[j];
            cur[s] = top[j][0];
            cr_expect_eq(cur[s], alone[s][t], "%s fork %d (%s), step %d: %d together, %d alone", file, s,
                         specs[s] ? specs[s] : "none", t, cur[s], alone[s][t]);
            if (t == STEPS - s - 1) {   /* its last step: the whole row, as alone */
                cr_assert(fwd_picked_logits(fs[s], row, err, sizeof err) == 0, "%s", err);
                cr_expect(!memcmp(row, alone_row[s], sizeof(float) * (size_t)nv),
                          "%s fork %d (%s): the last step's logits differ from its alone", file, s,
                          specs[s] ? specs[s] : "none");
            }
        }
    }
    /* every layer of every step of two or more sequences: one call for the batch; and each fork's
     * first append (alone or in the batch) copied each head's shared last page where that page had
     * room, every copy named to the device (page_moves), which builds it from its copy of the
     * shared page */
    if (device) {
        cr_expect_eq(sh(b)->joined - joined0, (STEPS - 1) * fwd_model(base)->hp.n_layer,
                     "%s: %d joined attention calls", file, sh(b)->joined - joined0);
        const kv_cache *kv = fwd_kv(base);
        int64_t shared = 0;
        for (int il = 0; il < kv_n_layer(kv); il++)
            for (int h = 0; h < kv_n_head_kv(kv); h++) {
                const int np_ = kv_n_pages(kv, il, h);
                shared += np_ > 0 && kv_layer_page(kv, il, h, np_ - 1)->n < kv_page_size(kv);
            }
        cr_expect_gt(shared, 0, "%s: the prompt's last pages are full: nothing to copy", file);
        cr_expect_eq(sh(b)->pages_moved - moved0, n * shared, "%s: %ld copies named, %d forks of %ld shared pages",
                     file, (long)(sh(b)->pages_moved - moved0), n, (long)shared);
    }
    for (int s = 0; s < n; s++) {
        cr_expect_eq(fwd_pos(fs[s]), len0 + STEPS);
        if (pss[s]) {
            const pol_step_stats *q = pol_set_stats(pss[s]);
            cr_expect(q->pages_sum == alone_st[s].pages_sum && q->bytes_touched_total == alone_st[s].bytes_touched_total &&
                          q->tokens_last == alone_st[s].tokens_last,
                      "%s fork %d (%s): step statistics differ together", file, s, specs[s]);
        }
        fwd_free(fs[s]);
        pol_set_free(pss[s]);
        free(alone_row[s]);
    }
    /* the forks shared its pages and changed none of them */
    kv_stats st1;
    kv_get_stats(fwd_kv(base), &st1);
    cr_expect(fwd_pos(base) == len0 && st1.tokens_kept == st0.tokens_kept && st1.bytes_resident == st0.bytes_resident,
              "%s: the forked context changed", file);
    float *again = malloc(sizeof(float) * (size_t)nv);
    cr_assert(fwd_decode(base, first, again, NULL, err, sizeof err) == 0, "%s", err);
    fwd_ctx *solo = fwd_create(m, b, &fo, err, sizeof err);
    cr_assert(solo, "%s", err);
    cr_assert(fwd_eval(solo, ids, (int64_t)np, l0, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    cr_assert(fwd_decode(solo, first, row, NULL, err, sizeof err) == 0, "%s", err);
    cr_expect(!memcmp(again, row, sizeof(float) * (size_t)nv), "%s: the forked context decodes differently after", file);
    free(again);
    fwd_free(solo);
    fwd_free(base);
    free(l0);
    free(row);
    free(ids);
    be_free(b);
    model_free(m);
}

Test(residency, a_batch_of_forks_decodes_each_as_alone_on_the_cpu)
{
    const char *g[] = { NULL, "quest:budget=24", "chess:preset=aggressive,window=1", "streaming:budget=40" };
    batch_vs_alone(TD "tiny/tiny-gemma3-q4_k_m.gguf", 0, g, 4, -1);
    const char *l[] = { "full", "quest:budget=24", "sentkv:budget=60,len=6,delta=3", "streaming:budget=8,sinks=2",
                        NULL, "chess", "quest:budget=6", "full" };
    batch_vs_alone(TD "tiny/tiny-llama-q4_k_m.gguf", 0, l, 8, -1);
}

Test(residency, a_batch_of_forks_decodes_each_as_alone_on_twins)
{
    const char *g[] = { NULL, "quest:budget=24", "chess:preset=aggressive,window=1", "sentkv:budget=60,len=6,delta=3" };
    batch_vs_alone(TD "tiny/tiny-gemma3-q4_k_m.gguf", 1, g, 4, 1);   /* CHESS's scores: one more wait */
    const char *l[] = { "full", "quest:budget=24", "streaming:budget=8,sinks=2", "chess" };
    batch_vs_alone(TD "tiny/tiny-llama-q4_k_m.gguf", 1, l, 4, 1);
    /* several CHESS sequences rebuilding: every sequence's scores issued before any is read, so a
     * step waits once for them all (Quest's bounds stay on the device) */
    const char *c[] = { "chess", "chess:preset=aggressive,window=1", "quest:budget=24", "chess" };
    batch_vs_alone(TD "tiny/tiny-llama-q4_k_m.gguf", 1, c, 4, 1);
}
