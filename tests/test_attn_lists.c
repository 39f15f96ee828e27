/* test_attn_lists.c - the page lists the forward pass hands attention, and the shape promise.
 *
 * The forward pass keeps each layer's list of every page from one call to the next and, while the
 * cache's layer shape (kv_layer_shape) stays the same, updates only each head's last pages; it
 * gives the shape to the backend (be_attn.shape), which then looks only at those pages
 * (kernels/page_tables.c). A "checking" backend runs every op on the CPU backend and, before each
 * attention call that carries a shape, checks (1) that the list is exactly the cache's pages of
 * that layer, head by head, and (2) that when the shape is the one the last call under the same
 * name gave, each head's pages before its previous last one are the same pages with the same
 * generation and rows: the promise the backend relies on. Runs: prefill in chunks, decode across
 * page boundaries, a rewind, on both tiny models (Gemma 3's sliding-window layers drop pages), with
 * no policy and with policies that evict (TAKE in prefill, H2O in decode), merge (Chelsea) and
 * select (CHESS: its decode calls carry no shape). The backend has residency (bind), so decode
 * steps without a policy between layers defer their rows as on a GPU. Every call also goes through
 * what the CUDA backend does with it on the host (the deferred rows' list, pt_begin_call,
 * pt_build, the batch scattered into junk-filled "device" memory, last piece first), and every
 * descriptor must lead to its page's rows, positions, biases and masks. Every bounds call (Quest,
 * SentKV) likewise goes through the device's summary lists (kernels/summary_lists.c), and every
 * summary it names must be what the "device" holds: the (gen, n) contract and the shapes the
 * policies promise, checked through real decodes and rewinds; Quest's summaries are folded, as the
 * CUDA backend does, from the "device's" page copies (bd_fold_elem over every thread), so each must
 * equal the cache's summary of its page at that moment. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/forward.h"
#include "engine/kvcache.h"
#include "engine/model.h"
#include "engine/policy/policy.h"
#include "engine/sampler.h"
#include "kernels/backend.h"
#include "kernels/bound_kernels.h"
#include "kernels/page_tables.h"
#include "kernels/summary_lists.h"
#include "tests/fwd_fixture.h"

#define TD "../shared/testdata/"
#define MAX_LAYERS 64

typedef struct seen_list {
    uint64_t table, shape;
    int64_t off[65];
    be_kv_page *pages;
    int64_t n;
} seen_list;

typedef struct checker {
    be_backend *cpu;
    const kv_cache *kv;       /* the forward context's cache */
    seen_list last[MAX_LAYERS];
    int64_t calls, shaped, appended, moved, bad, deferred, entries;
    int64_t tails;            /* deferred calls whose list was written only where pt_build reads it */
    int64_t max_cur;          /* the most rows a call gave that the cache takes later */
    /* the CUDA backend's bookkeeping, host memory standing in for the device */
    ub_batch batch;
    pc_table copies;
    pt_set tables;
    be_kv_page *rows;         /* a deferred call's whole list, to check against */
    be_kv_page *part;         /* the list as the CUDA backend writes it: junk where pt_build does not read */
    int64_t cap_rows;
    /* the selection policies' summaries as the CUDA backend keeps them (kernels/summary_lists.c) */
    ub_batch sbatch;
    sl_table sums;
    int64_t bound_calls, bound_looked, bound_entries;
    int64_t placed;           /* lists placed ahead of attention */
    int64_t placed_bounds;    /* summary lists placed ahead of bounds calls */
    int64_t by_index;         /* calls whose selection came as indices into the list (be_attn.sel_best) */
    int64_t sel_shaped, sel_appended;   /* selections' lists with a shape of their own; of them, kept ones */
    uint64_t *layer_shapes;   /* every layer shape a list of every page has carried */
    int64_t n_layer_shapes, cap_layer_shapes;
} checker;

static checker ck;
/* rows the cache takes later (a deferred decode step's or prefill chunk's) "on the device" */
static uint16_t cur16[1 << 16] __attribute__((aligned(16)));
static int32_t cur_pos[64];

static void *junk_alloc(void *ud, size_t bytes)
{
    void *p = malloc(bytes);
    if (p) memset(p, 0xa5, bytes);
    return p;
}
static void dev_release(void *ud, void *p) { free(p); }
/* as the CUDA backend queues page rows: read from the pages when the batch is sent */
static int dev_upload(void *ud, void *dst, const void *src, size_t bytes) { return ub_add_ref(ud, dst, src, bytes); }

/* What the device does with a batch: the packed bytes copied, then the scatter kernel's pieces
 * put in place, last piece first. */
static void scatter(ub_batch *ub)
{
    size_t bytes = ub_packed_bytes(ub);
    unsigned char *buf = aligned_alloc(16, (bytes + 15) & ~(size_t)15);
    cr_assert(buf);
    ub_pack(ub, buf);
    const ub_piece *tab = (const ub_piece *)(buf + ub_table_offset(ub));
    for (int64_t i = ub->n - 1; i >= 0; i--) ub_scatter_piece(buf, &tab[i], 0, 1);
    ub_clear(ub, 1);
    free(buf);
}

/* The batch's flush: a list whose descriptors move on the device sends what was queued first. */
static int ck_flush(void *ud)
{
    scatter(ud);
    return 0;
}

/* What the CUDA backend does with the call before its kernels, on the host; then every descriptor
 * checked against the entry it stands for. */
static void through_tables(const be_attn *a)
{
    const be_kv_page *list = a->pages, *built = a->pages;
    const int64_t *hp = a->head_pages;
    int64_t e = a->n_pages, hp_rows[65], hp_part[65], from[64];
    const uint16_t *cur = NULL;
    pt_begin_call(&ck.tables, 64);
    if (a->n_cur > 0) {
        ck.deferred++;
        int64_t len = be_attn_rows_len(a), kvd = (int64_t)a->n_head_kv * a->head_dim;
        cr_assert(2 * a->n_cur * kvd <= (int64_t)(sizeof cur16 / sizeof *cur16) && a->n_cur <= 64);
        ck.max_cur = a->n_cur > ck.max_cur ? a->n_cur : ck.max_cur;
        if (len > ck.cap_rows) {
            ck.rows = realloc(ck.rows, sizeof *ck.rows * (size_t)len);
            ck.part = realloc(ck.part, sizeof *ck.part * (size_t)len);
            cr_assert(ck.rows && ck.part);
            ck.cap_rows = len;
        }
        cur = cur16;
        e = be_attn_rows_list(a, cur, cur + a->n_cur * kvd, cur_pos, ck.rows, hp_rows);
        list = ck.rows;
        hp = hp_rows;
        /* what the backend builds on: only what pt_build reads written, junk (pointers that lead
         * nowhere) elsewhere, so reading it would fail the checks below */
        cr_assert_eq(be_attn_rows_heads(a, hp_part), e);
        cr_assert(!memcmp(hp_part, hp_rows, sizeof(int64_t) * (size_t)(a->n_head_kv + 1)));
        memset(ck.part, 0xa5, sizeof *ck.part * (size_t)len);
        int tail = pt_reads_from(&ck.tables, a->table, a->shape, hp_part, a->n_head_kv, from);
        ck.tails += tail;
        be_attn_rows_fill(a, cur, cur + a->n_cur * kvd, cur_pos, ck.part, hp_part, tail ? from : NULL);
        built = ck.part;
    }
    pt_call out;
    pt_direct rows = { cur, sizeof(uint16_t) * 2 * (size_t)(a->n_cur * a->n_head_kv * a->head_dim) };
    cr_assert_eq(pt_build(&ck.tables, a->table, a->shape, built, e, hp, a->n_head_kv, cur ? &rows : NULL, &out), PT_OK);
    scatter(&ck.batch);
    for (int g = 0; hp && g <= a->n_head_kv; g++) cr_assert_eq(out.head_pages[g], hp[g]);
    for (int64_t i = 0; i < e; i++) {
        const be_kv_page *pg = &list[i];
        const ag_page *d = &out.pages[i];
        cr_assert_eq(d->n, pg->n, "entry %lld", (long long)i);
        if (pg->n <= 0) continue;
        if (cur && pg->k >= cur && pg->k < cur + a->n_cur * a->n_head_kv * a->head_dim) {
            cr_assert(d->k == pg->k && d->v == pg->v && d->pos == pg->pos && pg->n <= BE_CUR_ROWS);
            continue;
        }
        size_t vals = (size_t)(pg->n - 1) * (size_t)pg->stride + (size_t)a->head_dim;
        cr_assert(!memcmp(d->k, pg->k, sizeof(uint16_t) * vals) && !memcmp(d->v, pg->v, sizeof(uint16_t) * vals),
                  "entry %lld: rows", (long long)i);
        cr_assert(!memcmp(d->pos, pg->pos, sizeof(int32_t) * (size_t)pg->n), "entry %lld: positions", (long long)i);
        if (pg->bias)
            cr_assert(d->bias && !memcmp(d->bias, pg->bias, sizeof(float) * (size_t)pg->n), "entry %lld: bias",
                      (long long)i);
        else
            cr_assert_null(d->bias);
        if (pg->mask)
            cr_assert(!memcmp(out.masks + d->mask_off, pg->mask, sizeof(uint64_t) * (size_t)((pg->n + 63) / 64)),
                      "entry %lld: mask", (long long)i);
        else
            cr_assert_eq(d->mask_off, -1);
        ck.entries++;
    }
}

static int same_entry(const be_kv_page *a, const be_kv_page *b)
{
    return a->k == b->k && a->v == b->v && a->pos == b->pos && a->bias == b->bias && a->mask == b->mask &&
           a->n == b->n && a->stride == b->stride && a->head_step == b->head_step && a->gen == b->gen;
}

/* Every entry of a selection's list (one whose shape is its own, engine/page_list.h sel_list) is
 * one of its head's pages as the cache has it now. */
static void check_selection(const be_attn *a, int il)
{
    ck.sel_shaped++;
    for (int h = 0; h < kv_n_head_kv(ck.kv); h++)
        for (int64_t e = a->head_pages[h]; e < a->head_pages[h + 1]; e++) {
            const be_kv_page *x = &a->pages[e];
            int found = 0;
            for (int j = 0; j < kv_n_pages(ck.kv, il, h) && !found; j++) {
                const kv_page *p = kv_layer_page(ck.kv, il, h, j);
                found = x->k == p->k && x->v == p->v && x->pos == p->pos && x->n == p->n && x->gen == p->gen &&
                        x->bias == (p->merged ? p->logdeg : NULL) && x->stride == kv_head_dim(ck.kv) && x->head_step == 0;
            }
            if (!found) ck.bad++;
            cr_assert(found, "layer %d head %d: selection entry %lld is none of the cache's pages", il, h, (long long)e);
        }
}

static void check_list(const be_attn *a)
{
    ck.calls++;
    if (!a->shape) return;
    ck.shaped++;
    int il = (int)(a->table & 0xfffff) - 1;
    cr_assert(il >= 0 && il < kv_n_layer(ck.kv) && il < MAX_LAYERS, "a list named %llx", (unsigned long long)a->table);
    cr_assert(a->head_pages, "layer %d: a list with a shape has per-head offsets", il);
    int Hkv = kv_n_head_kv(ck.kv);
    /* (1) exactly the cache's pages under the layer's shape, or under a shape of a selection's own
     * (never a layer's, now or before), some of them */
    if (a->shape != kv_layer_shape(ck.kv, il)) {
        for (int64_t i = 0; i < ck.n_layer_shapes; i++)
            cr_assert_neq(ck.layer_shapes[i], a->shape, "layer %d: a list under an old layer shape", il);
        check_selection(a, il);
    } else if (!ck.n_layer_shapes || ck.layer_shapes[ck.n_layer_shapes - 1] != a->shape) {
        if (ck.n_layer_shapes == ck.cap_layer_shapes) {
            ck.cap_layer_shapes = ck.cap_layer_shapes ? 2 * ck.cap_layer_shapes : 256;
            ck.layer_shapes = realloc(ck.layer_shapes, sizeof *ck.layer_shapes * (size_t)ck.cap_layer_shapes);
            cr_assert(ck.layer_shapes);
        }
        ck.layer_shapes[ck.n_layer_shapes++] = a->shape;
    }
    for (int h = 0; h < Hkv && a->shape == kv_layer_shape(ck.kv, il); h++) {
        int np = kv_n_pages(ck.kv, il, h);
        cr_assert_eq(a->head_pages[h + 1] - a->head_pages[h], np, "layer %d head %d: %lld entries for %d pages", il, h,
                     (long long)(a->head_pages[h + 1] - a->head_pages[h]), np);
        for (int j = 0; j < np; j++) {
            const kv_page *p = kv_layer_page(ck.kv, il, h, j);
            const be_kv_page *e = &a->pages[a->head_pages[h] + j];
            int ok = e->k == p->k && e->v == p->v && e->pos == p->pos && e->n == p->n && e->gen == p->gen &&
                     e->bias == (p->merged ? p->logdeg : NULL) && !e->mask && e->stride == kv_head_dim(ck.kv) &&
                     e->head_step == 0;
            if (!ok) ck.bad++;
            cr_assert(ok, "layer %d head %d page %d: the entry is not the cache's page", il, h, j);
        }
    }
    /* (2) the promise, against the last call under this name */
    seen_list *L = &ck.last[il];
    if (L->table == a->table && L->shape == a->shape) {
        ck.appended++;
        ck.sel_appended += a->shape != kv_layer_shape(ck.kv, il);
        for (int h = 0; h < Hkv; h++) {
            int64_t was = L->off[h + 1] - L->off[h];
            cr_assert_geq(a->head_pages[h + 1] - a->head_pages[h], was, "layer %d head %d shrank under one shape", il, h);
            for (int64_t j = 0; j + 1 < was; j++)
                cr_assert(same_entry(&a->pages[a->head_pages[h] + j], &L->pages[L->off[h] + j]),
                          "layer %d head %d page %lld changed under one shape", il, h, (long long)j);
            if (a->head_pages[h] != L->off[h]) ck.moved++;
        }
    }
    int64_t e = a->head_pages[Hkv];
    be_kv_page *np = realloc(L->pages, sizeof *np * (size_t)(e > 0 ? e : 1));
    cr_assert(np);
    L->pages = np;
    if (e) memcpy(L->pages, a->pages, sizeof *np * (size_t)e);
    L->n = e;
    memcpy(L->off, a->head_pages, sizeof(int64_t) * (size_t)(Hkv + 1));
    L->table = a->table;
    L->shape = a->shape;
}

/* Every op the CPU backend's; attention checked first. */
static void c_matmul(be_backend *b, const be_mm *mms, int n_mm, const float *x, int64_t n_tok)
{
    ck.cpu->ops->matmul(ck.cpu, mms, n_mm, x, n_tok);
}
static void c_rmsnorm(be_backend *b, const float *x, const float *w, float *y, int64_t rows, int64_t dim, float eps)
{
    ck.cpu->ops->rmsnorm(ck.cpu, x, w, y, rows, dim, eps);
}
static void c_qk_rope(be_backend *b, const be_qk *r) { ck.cpu->ops->qk_rope(ck.cpu, r); }
static void c_glu(be_backend *b, float *gate, const float *up, int64_t n, int gelu)
{
    ck.cpu->ops->glu(ck.cpu, gate, up, n, gelu);
}
static void c_get_rows(be_backend *b, const be_weight *w, const int32_t *ids, int64_t n, float scale, float *o)
{
    ck.cpu->ops->get_rows(ck.cpu, w, ids, n, scale, o);
}
static void c_attention(be_backend *b, const be_attn *a)
{
    ck.by_index += a->sel_best != NULL;
    check_list(a);
    through_tables(a);
    ck.cpu->ops->attention(ck.cpu, a);
}
/* sl_device.copy_rows as the CUDA backend's (summary_copy_rows): the "device's" copy of the page,
 * where it holds those rows under that generation. */
static const uint16_t *ck_copy_rows(void *ud, const uint16_t *k, uint64_t gen, int32_t rows, int64_t dim)
{
    be_kv_page pg = { .k = k, .gen = gen, .n = rows, .stride = (int32_t)dim };
    const pc_copy *c = pc_find(&ck.copies, &pg, rows);
    return c ? c->k : NULL;
}
/* A list placed ahead of attention (fwd_place_pages) is checked as a call's and goes through the
 * same bookkeeping, so the next call under its name builds on what it left. */
static void c_place_pages(be_backend *b, const be_attn *a, int n)
{
    for (int i = 0; i < n; i++) {
        ck.placed++;
        check_list(&a[i]);
        through_tables(&a[i]);
    }
}
static void c_scores(be_backend *b, const float *m, int64_t n_rows, int64_t dim, const float *x, float *y)
{
    ck.cpu->ops->scores(ck.cpu, m, n_rows, dim, x, y);
}
/* Every bounds call (Quest's pages, SentKV's segments) also goes through the device's summary
 * lists, the batch scattered into junk-filled memory last piece first: each entry the call names
 * must then hold its summary. A summary whose contents changed under the same (mn, gen, n), or a
 * shape given where an entry before a head's last one changed, leaves a stale entry and fails. */
static void through_sums(const be_bounds *r)
{
    char err[128];
    const sl_list *L = sl_update(&ck.sums, r, err, sizeof err);
    cr_assert(L, "%s", err);
    /* the CUDA backend's order: the summaries sent, then the fold kernel, its every thread, from
     * the page copies */
    scatter(&ck.sbatch);
    for (int64_t j = 0; j < ck.sums.n_folds; j++)
        for (int tid = 0; tid < BD_FOLD_THREADS; tid++)
            for (int64_t e = tid; e < r->dim; e += BD_FOLD_THREADS)
                bd_fold_elem(&ck.sums.folds[j], r->dim, e, L->dev, L->dev_n);
    size_t half = sizeof(float) * (size_t)r->dim;
    for (int h = 0; h < r->n_head_kv; h++)
        for (int64_t i = 0; i < be_bounds_count(r, h); i++) {
            const be_summary *sm = &r->sum[r->off[h] + i];
            const float *d = L->dev + ((int64_t)h * L->cap + i) * 2 * r->dim;
            cr_assert(!memcmp(d, sm->mn, half) && !memcmp(d + r->dim, sm->mx, half) &&
                          L->dev_n[(int64_t)h * L->cap + i] == sm->n,
                      "bounds call %lld, head %d, summary %lld: the device holds another", (long long)ck.bound_calls, h,
                      (long long)i);
        }
}
static void c_bound_pages(be_backend *b, be_bounds *r)
{
    uint64_t looked = ck.sums.looked;
    through_sums(r);
    ck.bound_calls++;
    ck.bound_looked += (int64_t)(ck.sums.looked - looked);
    ck.bound_entries += be_bounds_total(r, NULL);
    ck.cpu->ops->bound_pages(ck.cpu, r);
}
/* A selection's summaries placed ahead of its bounds calls: through the same lists and checks. */
static void c_place_bounds(be_backend *b, const be_bounds *r)
{
    ck.placed_bounds++;
    through_sums(r);
}
static void c_add_norm(be_backend *b, float *x, float *o, const float *post, const float *w, float *h, int64_t rows,
                       int64_t dim, float eps)
{
    ck.cpu->ops->add_norm(ck.cpu, x, o, post, w, h, rows, dim, eps);
}
static void c_key_means(be_backend *b, const be_key_means *m) { ck.cpu->ops->key_means(ck.cpu, m); }
static void c_attn_mass(be_backend *b, const be_mass *m) { ck.cpu->ops->attn_mass(ck.cpu, m); }
static void c_destroy(be_backend *b) { free(b); }
/* Residency with nothing to keep: the forward pass then defers a decode step's rows. */
static int c_bind(be_backend *b, void *host, size_t bytes, char *err, size_t errlen) { return 0; }
static void c_unbind(be_backend *b, void *host) {}
/* The CPU backend's threads: the deferred rows' appends spread over them (kv_append_on). */
static struct tp_pool *c_host_pool(be_backend *b) { return ck.cpu->ops->host_pool(ck.cpu); }

static const be_ops check_ops = {
    "check", c_matmul, c_rmsnorm, c_qk_rope, c_glu, c_get_rows, c_attention, c_scores, c_bound_pages, NULL, NULL,
    c_destroy, c_add_norm, c_bind, c_unbind, NULL, NULL, NULL, NULL, NULL, NULL, NULL, c_key_means, NULL,
    c_attn_mass, NULL, c_host_pool, NULL, NULL, NULL, NULL, NULL, c_place_pages,
    c_place_bounds, NULL,
};

/* Prefill in chunks of 40, 40 greedy steps (pages of 16: the steps cross page boundaries), a
 * rewind into the decoded tokens and 20 more steps, under spec; deferred: decode steps defer. */
static void run_with(const char *file, const char *spec, int deferred, int strict);
static int rewind_by = 13;   /* tokens the run rewinds after its first decode */
static void run(const char *file, const char *spec, int deferred) { run_with(file, spec, deferred, 1); }

/* The checker reset and its "device" set up, the model loaded; *b is the checking backend. */
static model *ck_open(const char *file, be_backend **b)
{
    char err[512];
    model *m;
    cr_assert(model_load(&m, file, NULL, err, sizeof err) == 0, "%s", err);
    memset(&ck, 0, sizeof ck);
    pc_device pd = { &ck.batch, junk_alloc, dev_release, dev_upload };
    pc_init(&ck.copies, &pd, 64);
    pt_device td = { NULL, junk_alloc, dev_release };
    pt_init(&ck.tables, &td, &ck.copies, &ck.batch);
    ck.batch.flush = ck_flush;
    ck.batch.flush_ud = &ck.batch;
    sl_device sd = { NULL, junk_alloc, dev_release, ck_copy_rows };
    sl_init(&ck.sums, &sd, &ck.sbatch);
    ck.cpu = be_cpu_create(2, err, sizeof err);
    cr_assert(ck.cpu, "%s", err);
    *b = calloc(1, sizeof **b);
    cr_assert(*b);
    (*b)->ops = &check_ops;
    (*b)->n_threads = 2;
    return m;
}

static void ck_close(model *m, be_backend *b)
{
    for (int i = 0; i < MAX_LAYERS; i++) free(ck.last[i].pages);
    free(ck.layer_shapes);
    pt_free(&ck.tables);
    pc_free(&ck.copies);
    ub_free(&ck.batch);
    sl_free(&ck.sums);
    ub_free(&ck.sbatch);
    free(ck.rows);
    free(ck.part);
    be_free(ck.cpu);
    be_free(b);
    model_free(m);
}

/* A sequence on the checking backend: the model and backend (ck_open), a forward context of
 * pages of 16 and chunks of 40 whose lists are checked as it runs, spec's policy on it (traced: a
 * trace of its choices on) and prompt p3 prefilled, its logits in l. */
typedef struct ck_seq {
    model *m;
    be_backend *b;
    fwd_ctx *f;
    pol_set *ps;
    float *l;
    int nv;
} ck_seq;

static void ck_seq_open(ck_seq *q, const char *file, const char *spec, int traced)
{
    char err[512];
    q->m = ck_open(file, &q->b);
    size_t n;
    int32_t *ids = fwd_fixture_prompt(q->m, TD "prompts/p3.txt", &n);
    fwd_opts fo = { 2048, 40, 16 };
    q->f = fwd_create(q->m, q->b, &fo, err, sizeof err);
    cr_assert(q->f, "%s", err);
    ck.kv = fwd_kv(q->f);
    q->ps = fwd_fixture_policy(q->f, spec);
    if (traced) cr_assert(pol_set_trace(q->ps, 0, (int64_t)1 << 30) == 0);
    q->nv = q->m->hp.n_vocab;
    q->l = malloc(sizeof(float) * (size_t)q->nv);
    cr_assert(q->l);
    cr_assert(fwd_eval(q->f, ids, (int64_t)n, q->l, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    free(ids);
}

/* Its context freed (unless it was already: f NULL), then the rest. */
static void ck_seq_close(ck_seq *q)
{
    if (q->f) {
        pol_set_free(q->ps);
        fwd_free(q->f);
    }
    free(q->l);
    ck_close(q->m, q->b);
}

/* strict: the run must have kept a shape, moved entries, and (deferred) deferred a step. */
static void run_with(const char *file, const char *spec, int deferred, int strict)
{
    char err[512];
    ck_seq q;
    ck_seq_open(&q, file, spec, 0);
    model *m = q.m;
    fwd_ctx *f = q.f;
    float *l = q.l;
    const int nv = q.nv;
    for (int round = 0; round < 2; round++) {
        for (int s = 0; s < (round ? 20 : 40); s++)
            cr_assert(fwd_decode(f, samp_argmax(l, nv), l, NULL, err, sizeof err) == 0, "%s", err);
        if (!round) {
            fwd_rewind(f, fwd_pos(f) - rewind_by);
            int32_t t = 7;
            cr_assert(fwd_eval(f, &t, 1, l, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
        }
    }
    if (strict) cr_expect_gt(ck.appended, 0, "%s under %s: no call kept its layer's shape", file, spec ? spec : "no policy");
    if (strict && m->hp.n_head_kv > 1)
        cr_expect_gt(ck.moved, 0, "%s under %s: no head's entries moved", file, spec ? spec : "no policy");
    cr_expect_eq(ck.bad, 0);
    if (deferred) cr_expect_gt(ck.deferred, 0, "%s under %s: no step deferred", file, spec ? spec : "no policy");
    if (deferred && strict)
        cr_expect_gt(ck.tails, 0, "%s under %s: no deferred step's list was written only where it is read", file,
                     spec ? spec : "no policy");
    cr_expect_gt(ck.entries, 500, "%s: %lld descriptors checked", file, (long long)ck.entries);
    ck_seq_close(&q);
}

/* With no policy the prompt's chunks defer their rows too: whole chunks of 40 come as rows the
 * cache takes later, in entries of BE_CUR_ROWS. */
Test(attn_lists, lists_of_every_page_follow_the_cache_and_keep_the_shape_promise)
{
    static const char *const files[] = { TD "tiny/tiny-llama-q4_k_m.gguf", TD "tiny/tiny-gemma3-q4_k_m.gguf" };
    for (int i = 0; i < 2; i++) {
        run(files[i], NULL, 1);
        cr_expect_eq(ck.max_cur, 40, "%s: at most %lld rows deferred in a call", files[i], (long long)ck.max_cur);
    }
}

/* Quest and SentKV, alone and after policies that evict or merge: the summaries the device keeps
 * follow their generations and the promised shapes through prefill, decode and a rewind (checked
 * in c_bound_pages), and under Quest's kept shape a call looks at a few entries a head, not all. */
Test(attn_lists, the_device_summaries_follow_quest_and_sentkv)
{
    static const struct { const char *file, *spec; } runs[] = {
        { TD "tiny/tiny-llama-q4_k_m.gguf", "quest:budget=48" },
        { TD "tiny/tiny-gemma3-q4_k_m.gguf", "quest:budget=64" },
        { TD "tiny/tiny-llama-q4_k_m.gguf", "sentkv:budget=40" },
        { TD "tiny/tiny-gemma3-q4_k_m.gguf", "sentkv:budget=60,len=6,delta=3" },
        { TD "tiny/tiny-gemma3-q4_k_m.gguf", "take:budget=0.5+quest:budget=64" },
        { TD "tiny/tiny-llama-q4_k_m.gguf", "chelsea+quest:budget=64" },
        { TD "tiny/tiny-llama-q4_k_m.gguf", "take:budget=0.6+sentkv:budget=40,len=5,delta=2" },
    };
    rewind_by = 37;   /* pages of 16 dropped, back to the pool and reused */
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        run_with(runs[i].file, runs[i].spec, 0, 0);
        cr_expect_gt(ck.bound_calls, 10, "%s under %s: %lld bounds calls", runs[i].file, runs[i].spec,
                     (long long)ck.bound_calls);
        cr_log_info("%s under %s: %lld bounds calls looked at %lld of %lld summaries", runs[i].file, runs[i].spec,
                    (long long)ck.bound_calls, (long long)ck.bound_looked, (long long)ck.bound_entries);
        if (!strncmp(runs[i].spec, "quest", 5))   /* alone: the shape holds but where pages open or go */
            cr_expect_lt(ck.bound_looked * 4, ck.bound_entries, "%s under %s: %lld of %lld summaries looked at",
                         runs[i].file, runs[i].spec, (long long)ck.bound_looked, (long long)ck.bound_entries);
        /* The summaries are folded where the "device" holds their rows (Quest's of a page, SentKV's
         * of a segment's runs of rows in its pages): alone, all but those whose last row a decode
         * step deferred and a rewind's; after an eviction or a merge, those whose pages the next
         * attention call has not sent yet are sent. */
        cr_log_info("%s under %s: %llu of %llu summaries folded", runs[i].file, runs[i].spec,
                    (unsigned long long)ck.sums.folded, (unsigned long long)ck.sums.sent);
        if (!strchr(runs[i].spec, '+'))
            cr_expect(ck.sums.folded * 2 > ck.sums.sent, "%s under %s: %llu of %llu summaries folded", runs[i].file,
                      runs[i].spec, (unsigned long long)ck.sums.folded, (unsigned long long)ck.sums.sent);
        else
            cr_expect(ck.sums.folded > 0, "%s under %s: none of %llu summaries folded", runs[i].file, runs[i].spec,
                      (unsigned long long)ck.sums.sent);
    }
}

Test(attn_lists, under_policies_that_evict_merge_and_select)
{
    run(TD "tiny/tiny-gemma3-q4_k_m.gguf", "take:budget=0.5", 1);
    run(TD "tiny/tiny-llama-q4_k_m.gguf", "h2o:budget=0.3", 0);
    run(TD "tiny/tiny-llama-q4_k_m.gguf", "chelsea", 0);
    run(TD "tiny/tiny-gemma3-q4_k_m.gguf", "chess:preset=aggressive,window=1", 0);
    /* CHESS's lists of its pages are kept from step to step under shapes of their own: the promise
     * checked, and kept at most steps (its choice changes little between steps) */
    cr_expect_gt(ck.sel_shaped, 50, "CHESS: %lld selection lists with a shape", (long long)ck.sel_shaped);
    cr_expect_gt(ck.sel_appended * 2, ck.sel_shaped, "CHESS: %lld of %lld selection lists kept their shape",
                 (long long)ck.sel_appended, (long long)ck.sel_shaped);
    run(TD "tiny/tiny-llama-q4_k_m.gguf", "chess:preset=moderate,rebuild=step", 0);
    cr_expect_gt(ck.sel_shaped, 50, "CHESS: %lld selection lists with a shape", (long long)ck.sel_shaped);
}

/* One run of a_selection_kept_... on the checking "device": prefill, 60 greedy steps with a rewind
 * after 40 (each step's token the first run's choice, feed, or its own where feed is NULL), every
 * step's logits and statistics into logits, stats and maps (the first global layer's page map:
 * MAP_MAX entries a step, -1 after its own). traced: a trace of the choices on, so the policy lists
 * its pages itself. */
enum { SEL_STEPS = 60, MAP_MAX = 64 };

static void selection_run(const char *file, const char *spec, int traced, const int32_t *feed, int32_t *tokens,
                          float *logits, pol_step_stats *stats, int *maps)
{
    char err[512];
    ck_seq q;
    ck_seq_open(&q, file, spec, traced);
    fwd_ctx *f = q.f;
    pol_set *ps = q.ps;
    float *l = q.l;
    const int nv = q.nv;
    for (int step = 0; step < SEL_STEPS; step++) {
        if (step == 40) {   /* back into the decoded tokens, and a token of another choice */
            fwd_rewind(f, fwd_pos(f) - 13);
            int32_t t = 7;
            cr_assert(fwd_eval(f, &t, 1, l, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
        }
        tokens[step] = feed ? feed[step] : samp_argmax(l, nv);
        cr_assert(fwd_decode(f, tokens[step], l, NULL, err, sizeof err) == 0, "%s", err);
        memcpy(logits + (size_t)step * (size_t)nv, l, sizeof(float) * (size_t)nv);
        stats[step] = *pol_set_stats(ps);
        int nm;
        const int *pm = pol_set_last_pages(ps, &nm);
        cr_assert(nm < MAP_MAX);
        for (int i = 0; i < MAP_MAX; i++) maps[step * MAP_MAX + i] = i < nm ? pm[i] : -1;
    }
    ck_seq_close(&q);
}

/* Quest's choice on a device goes to attention as indices into each layer's list of every page,
 * where its bounds left them (be_attn.sel_best), and the step's statistics are counted when the
 * step ends, from the layer's page spans rather than its pages. With a trace on, Quest brings the
 * bounds back and lists its pages itself. Both give each decode step's logits and statistics (pages
 * and tokens attended, pages held, the first global layer's page map) bit for bit, through
 * prefill, decode across page boundaries, a rewind and more steps, with one and several KV heads
 * and after an eviction. */
Test(attn_lists, a_selection_kept_on_the_device_attends_and_counts_as_the_list_of_its_pages)
{
    static const struct { const char *file, *spec; } runs[] = {
        { TD "tiny/tiny-llama-q4_k_m.gguf", "quest:budget=48" },
        { TD "tiny/tiny-gemma3-q4_k_m.gguf", "quest:budget=64" },
        { TD "tiny/tiny-llama-q4_k_m.gguf", "take:budget=0.6+quest:budget=64" },
    };
    for (size_t ri = 0; ri < sizeof runs / sizeof *runs; ri++) {
        char err[512];
        model *m;
        cr_assert(model_load(&m, runs[ri].file, NULL, err, sizeof err) == 0, "%s", err);
        const size_t nv = (size_t)m->hp.n_vocab;
        model_free(m);
        int32_t tokens[2][SEL_STEPS];
        float *logits[2];
        pol_step_stats stats[2][SEL_STEPS];
        static int maps[2][SEL_STEPS * MAP_MAX];
        int64_t by_index[2];
        for (int traced = 0; traced < 2; traced++) {
            logits[traced] = malloc(sizeof(float) * nv * SEL_STEPS);
            cr_assert(logits[traced]);
            selection_run(runs[ri].file, runs[ri].spec, traced, traced ? tokens[0] : NULL, tokens[traced],
                          logits[traced], stats[traced], maps[traced]);
            by_index[traced] = ck.by_index;
        }
        cr_expect_geq(by_index[0], 40, "%s: %lld calls took the choice as indices", runs[ri].spec, (long long)by_index[0]);
        cr_expect_eq(by_index[1], 0, "%s: the traced run's calls took %lld choices as indices", runs[ri].spec,
                     (long long)by_index[1]);
        for (int step = 0; step < SEL_STEPS; step++) {
            cr_assert(!memcmp(logits[0] + step * nv, logits[1] + step * nv, sizeof(float) * nv),
                      "%s, step %d: the logits differ", runs[ri].spec, step);
            const pol_step_stats *a = &stats[0][step], *c = &stats[1][step];
            cr_assert(a->pages_last == c->pages_last && a->tokens_last == c->tokens_last &&
                          a->pages_total_last == c->pages_total_last,
                      "%s, step %d: pages %lld / %lld, tokens %lld / %lld, held %lld / %lld", runs[ri].spec, step,
                      (long long)a->pages_last, (long long)c->pages_last, (long long)a->tokens_last,
                      (long long)c->tokens_last, (long long)a->pages_total_last, (long long)c->pages_total_last);
            cr_assert(!memcmp(maps[0] + step * MAP_MAX, maps[1] + step * MAP_MAX, sizeof(int) * MAP_MAX),
                      "%s, step %d: the page maps differ", runs[ri].spec, step);
        }
        free(logits[0]);
        free(logits[1]);
    }
}

/* Forks of a sequence (fwd_fork) start their lists of every page as their source's, whose shapes
 * their caches have, where those name no page the source added since: a fork's decode steps
 * before its source's, its source's after them (past a page boundary), a second fork's first steps
 * after those (its source's lists now name the source's own pages), and a fork's steps after its
 * source was freed, each list exactly its own cache's pages (checked before every call); with no
 * policy and under Quest. */
Test(attn_lists, forks_start_their_lists_as_their_sources_and_list_their_own_pages)
{
    static const char *const specs[] = { NULL, "quest:budget=48" };
    for (int si = 0; si < 2; si++) {
        char err[512];
        ck_seq q;
        ck_seq_open(&q, TD "tiny/tiny-llama-q4_k_m.gguf", specs[si], 0);
        fwd_ctx *lead = q.f;
        float *l = q.l;
        const int nv = q.nv;
        for (int st = 0; st < 3; st++)
            cr_assert(fwd_decode(lead, samp_argmax(l, nv), l, NULL, err, sizeof err) == 0, "%s", err);
        const int32_t t0 = samp_argmax(l, nv);
        fwd_ctx *fk[3];
        pol_set *pf[3];
        for (int k = 0; k < 3; k++) {   /* the third under CHESS: its decode steps list its own pages */
            fk[k] = fwd_fork(lead, 4, err, sizeof err);
            cr_assert(fk[k], "%s", err);
            pf[k] = fwd_fixture_policy(fk[k], k < 2 ? specs[si] : "chess:preset=aggressive,window=1");
        }
        int64_t calls = ck.calls;
        for (int k = 0; k < 2; k++) {   /* a fork 20 steps (across a page boundary), then the source 20 */
            ck.kv = fwd_kv(k ? lead : fk[0]);
            int32_t t = t0;
            for (int st = 0; st < 20; st++) {
                cr_assert(fwd_decode(k ? lead : fk[0], t, l, NULL, err, sizeof err) == 0, "%s", err);
                t = samp_argmax(l, nv);
            }
        }
        for (int k = 1; k < 3; k++) {   /* the other forks' first steps, after their source moved on */
            ck.kv = fwd_kv(fk[k]);
            int32_t t1 = t0 + k;
            for (int st = 0; st < 20; st++) {
                cr_assert(fwd_decode(fk[k], t1, l, NULL, err, sizeof err) == 0, "%s", err);
                t1 = samp_argmax(l, nv);
            }
        }
        /* the CHESS fork's first list of every page, now that it has as many pages as its source's
         * lists name: a follow-up's chunk */
        const int32_t more[3] = { 5, 6, 7 };
        cr_assert(fwd_eval(fk[2], more, 3, l, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
        pol_set_free(q.ps);
        fwd_free(lead);   /* the forks outlive their source */
        q.f = NULL;
        ck.kv = fwd_kv(fk[0]);
        for (int st = 0; st < 5; st++)
            cr_assert(fwd_decode(fk[0], samp_argmax(l, nv), l, NULL, err, sizeof err) == 0, "%s", err);
        cr_expect_gt(ck.calls - calls, 100, "%lld calls checked", (long long)(ck.calls - calls));
        cr_expect_eq(ck.bad, 0);
        for (int k = 0; k < 3; k++) {
            pol_set_free(pf[k]);
            fwd_free(fk[k]);
        }
        ck_seq_close(&q);
    }
}

/* Rows of every page the cache's layers list. */
static uint64_t cache_rows(const kv_cache *kv)
{
    uint64_t rows = 0;
    for (int il = 0; il < kv_n_layer(kv); il++)
        for (int h = 0; h < kv_n_head_kv(kv); h++)
            for (int j = 0; j < kv_n_pages(kv, il, h); j++) rows += (uint64_t)kv_layer_page(kv, il, h, j)->n;
    return rows;
}

/* A snapshot restored into a second sequence on the same backend and placed on the "device"
 * (fwd_place_pages, as run_restore does): placing sends every row the cache lists, each layer's
 * list then keeps its shape at the next step's call (checked against the cache's pages), and that
 * step sends no page rows but its own (none, where it defers them) and gives the logits of the
 * sequence the snapshot was taken from. Without placing, the step sends the whole cache. Under a
 * selection by bounds (Quest, SentKV) the summaries are placed too: the step's bounds calls then
 * look at a few entries a head, where unplaced they compare every one. The next step is a decode
 * step, or a chunk of three tokens (a question's prefill, what usually follows a resume). */
Test(attn_lists, a_restored_cache_placed_on_the_device_sends_no_rows_at_the_next_step)
{
    static const struct { const char *file, *spec; } runs[] = {
        { TD "tiny/tiny-llama-q4_k_m.gguf", NULL },
        { TD "tiny/tiny-gemma3-q4_k_m.gguf", NULL },
        { TD "tiny/tiny-llama-q4_k_m.gguf", "quest:budget=48" },
        { TD "tiny/tiny-gemma3-q4_k_m.gguf", "quest:budget=64" },
        { TD "tiny/tiny-llama-q4_k_m.gguf", "sentkv:budget=40" },
    };
    for (size_t fi = 0; fi < sizeof runs / sizeof *runs; fi++)
        for (int mode = 0; mode < 4; mode++) {
            const int place = mode & 1, chunk = mode >> 1;   /* the next step: a decode step or a chunk */
            const char *file = runs[fi].file, *spec = runs[fi].spec;
            char err[512];
            be_backend *b;
            model *m = ck_open(file, &b);
            size_t n;
            int32_t *ids = fwd_fixture_prompt(m, TD "prompts/p3.txt", &n);
            fwd_pair pr;
            fwd_fixture_pair_open(&pr, m, b, spec);
            ck.kv = fwd_kv(pr.f1);
            fwd_fixture_pair_restore(&pr, ids, n, 5);
            ck.kv = fwd_kv(pr.f2);
            const uint64_t all = cache_rows(fwd_kv(pr.f2)), r0 = ck.copies.rows_uploaded;
            const int64_t appended0 = ck.appended, placed0 = ck.placed, bounds0 = ck.placed_bounds;
            if (place) fwd_place_pages(pr.f2);
            const uint64_t r1 = ck.copies.rows_uploaded;
            const int L = m->hp.n_layer, H = m->hp.n_head_kv, nv = m->hp.n_vocab;
            cr_expect_eq(ck.placed - placed0, place ? L : 0, "%s: %lld lists placed", file,
                         (long long)(ck.placed - placed0));
            cr_expect_eq(r1 - r0, place ? all : 0, "%s: placing sent %llu rows of the cache's %llu", file,
                         (unsigned long long)(r1 - r0), (unsigned long long)all);
            const int64_t appended1 = ck.appended, calls1 = ck.bound_calls, looked1 = ck.bound_looked,
                          entries1 = ck.bound_entries;
            const int32_t next[3] = { samp_argmax(pr.l1, nv), 7, 11 };
            const int n_next = chunk ? 3 : 1;
            float *l2 = malloc(sizeof(float) * (size_t)nv);
            cr_assert(l2);
            cr_assert((chunk ? fwd_eval(pr.f2, next, 3, l2, NULL, NULL, NULL, NULL, NULL, err, sizeof err)
                             : fwd_decode(pr.f2, next[0], l2, NULL, err, sizeof err)) == 0,
                      "%s", err);
            const int64_t looked = ck.bound_looked - looked1, entries = ck.bound_entries - entries1;
            if (spec && !chunk) {   /* a selection selects in decode */
                cr_expect_gt(ck.bound_calls - calls1, 0, "%s under %s: the step made no bounds call", file, spec);
                cr_expect_eq(ck.placed_bounds - bounds0, place ? ck.bound_calls - calls1 : 0,
                             "%s under %s: %lld summary lists placed for %lld bounds calls", file, spec,
                             (long long)(ck.placed_bounds - bounds0), (long long)(ck.bound_calls - calls1));
                if (place)
                    cr_expect_lt(looked * 4, entries, "%s under %s: the step looked at %lld of %lld summaries", file,
                                 spec, (long long)looked, (long long)entries);
                else
                    cr_expect_eq(looked, entries, "%s under %s: unplaced, the step looked at %lld of %lld", file, spec,
                                 (long long)looked, (long long)entries);
            }
            const uint64_t sent = ck.copies.rows_uploaded - r1;
            cr_log_info("%s under %s, %s, then %s: placing sent %llu rows, the next step %llu (the cache lists %llu); "
                        "its bounds looked at %lld of %lld summaries", file, spec ? spec : "no policy",
                        place ? "placed" : "not placed", chunk ? "a chunk" : "a decode step",
                        (unsigned long long)(r1 - r0), (unsigned long long)sent, (unsigned long long)all,
                        (long long)looked, (long long)entries);
            if (place) {
                cr_expect_leq(sent, (uint64_t)(n_next * L * H), "%s: the step after placing sent %llu page rows", file,
                              (unsigned long long)sent);
                cr_expect_eq(ck.appended - appended1, L, "%s: %lld of %d layers' calls kept the placed list's shape",
                             file, (long long)(ck.appended - appended1), L);
            } else {
                cr_expect_geq(sent, all, "%s: the step without placing sent %llu rows of %llu", file,
                              (unsigned long long)sent, (unsigned long long)all);
                cr_expect_eq(ck.appended - appended0, 0);
            }
            ck.kv = fwd_kv(pr.f1);
            cr_assert((chunk ? fwd_eval(pr.f1, next, 3, pr.l1, NULL, NULL, NULL, NULL, NULL, err, sizeof err)
                             : fwd_decode(pr.f1, next[0], pr.l1, NULL, err, sizeof err)) == 0,
                      "%s", err);
            cr_expect(!memcmp(pr.l1, l2, sizeof(float) * (size_t)nv), "%s: the restored sequence's step differs", file);
            cr_expect_eq(ck.bad, 0);
            fwd_fixture_pair_free(&pr);
            free(ids);
            free(l2);
            ck_close(m, b);
        }
}
