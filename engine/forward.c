/* forward.c - Gemma 3 and Llama forward passes on the backend op table (see forward.h).
 *
 * Per layer: attention block (pre-norm, Q/K/V, Gemma's QK-norm, RoPE, scaled dot-product attention
 * against the cache, output projection, Gemma's post-norm, residual), then the gated FFN block (GeGLU
 * for Gemma, SwiGLU for Llama) the same way. Prefill runs in chunks of n_batch tokens; logits are
 * only computed for the positions someone asked for. */
#include "engine/forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/bits.h"
#include "common/logit_pick.h"
#include "engine/page_list.h"
#include "engine/policy/policy.h"

#define OUT_ROWS 16   /* rows of the vocabulary projection computed at once when all logits are wanted */
#define MAX_PROBE 64  /* probe rows a prefill policy may append to a chunk (TAKE) */
#define BITS_MAX_BYTES ((size_t)64 << 20)   /* a device's choices of tokens kept for attention, at most */

struct fwd_ctx {
    const model *m;
    be_backend *b;
    kv_cache *kv;
    int n_batch;
    /* scratch, [n_batch][...] */
    float *x, *h, *q, *k, *v, *att, *o, *gate, *up, *logits;
    int32_t *pos;
    int32_t *tok;              /* chunk tokens followed by probe tokens */
    uint64_t scratch_bytes;
    int *global;               /* global (not sliding-window) layers */
    float *boundary;           /* per token id: sentence-boundary weight (for the policies) */
    int n_global;
    pol_set *pol;              /* NULL: attend to everything */
    sel_list *sels;            /* [n_layer] each global layer's list of a policy's selection, kept from step to step */
    unsigned char last_listed[64];   /* the layer's list has KV head h's last page (defer_stats) */
    page_list *lists;          /* [n_layer] each layer's list of every page, kept from call to call */
    page_spans *spans;         /* [n_layer] their pages' positions, kept likewise where a decode step
                                * observes a whole list (the page map), so it touches no page */
    uint64_t serial;           /* this context's share of the attention lists' names (be_attn.table) */
    /* A fork's source while both live (fwd_fork), whose lists a list of the fork's that was never
     * built starts as (fork_lists), where they name no page the source added after the fork:
     * fork_np[il * n_head_kv + h], head h's pages at the fork; the source's live forks, which it
     * unlinks when freed. */
    struct fwd_ctx *origin;
    int32_t *fork_np;
    struct fwd_ctx **forks;
    int n_forks, cap_forks;
    int decoding;              /* the current eval is one decode step */
    int last_chunk;            /* the chunk being run is the eval's last */
    char pol_err[256];
    char dev_err[320];         /* a failed backend op's message */
    int64_t eval_start;
    /* per decode step */
    int64_t st_pages, st_tokens;
    double st_sel_ms, st_attn_ms;
    int64_t st_pages_total;
    /* The K/V rows of decode steps and prefill chunks whose layers ran without the host, every
     * layer's ([n_layer][n][kvd], room for defer_cap rows a layer), taken into the cache after the
     * last layer (deferred). Two sets: while a prompt's chunk runs on the device in one, the host
     * takes the previous chunk's rows from the other into the cache, a layer at a time. */
    float *kall[2], *vall[2];
    int64_t defer_cap;         /* rows a layer they hold: n_batch, or 1 (a decode step's) where a
                                  chunk's do not fit (grow_defer) */
    int grow_retry;            /* growing them at creation found no room: tried once more at a chunk */
    int next_set;              /* the set the next deferred chunk writes */
    struct {
        int64_t at, n;         /* first position (-1: none) and rows a layer */
        int set;               /* in kall[set], vall[set] */
        int read;              /* the host has read them (waited for the device) */
        int layers;            /* layers the cache has taken them into so far */
        /* a batch's rows (fwd_decode_batch): row s is seqs[s]'s, at its own position; n_seq 0: the
         * rows are this context's own */
        fwd_ctx *seqs[FWD_BATCH_MAX];
        int n_seq;
    } pend;
    int out_rows;              /* rows `logits` holds (OUT_ROWS, or the chunk size when smaller) */
    float *batch_rows;         /* [FWD_BATCH_MAX][n_vocab], bound: a batch's picked rows (NULL: none yet) */
    const float *row_at;       /* where row_valid's row is: row, or a batch's lead's batch_rows */
    float *row;                /* [n_vocab]: the last picked step's logits, left with the backend */
    /* A device backend's selections by bounds (pol_env.sel_buf), bound: [n_layer][n_head_kv]
     * [BE_PICK_MAX + 1]. */
    int32_t *sel_buf;
    /* A device backend's choices of tokens (pol_env.bits_buf), bound: room for [n_global][n_head_kv]
     * [bits_words] (as a step lays them out, compact for its words). */
    uint64_t *bits_buf;
    int64_t bits_words;
    /* This decode step's layers whose selection attention read where the bounds left it: their
     * statistics wait for the step's end (sel_stats), when the answers are on the host. */
    struct dsel {
        int il;
        const int32_t *best, *n_best;
        int32_t k;
        int row;                       /* the step's row was deferred (defer_stats then too) */
        int64_t from[64];
        const uint64_t *bits;          /* a choice of tokens instead (pol_sel.bits), words a head */
        int64_t words;
        const page_spans *spans;       /* what the statistics read: the policy's (bits), the layer's (best) */
    } *dsel;
    int n_dsel;
    int row_valid;             /* row holds the logits of the cache's last token */
    int n_bound;               /* scratch buffers bound to the backend so far */
    be_page_rows *page_rows;   /* the rows a chunk's layer took, named to the backend (name_page_rows) */
    int64_t page_rows_cap;
};

#define N_BOUND 16

/* The scratch buffers the backend may keep on a device, in one order for bind and unbind. */
static void bound_bufs(const fwd_ctx *f, float *out[N_BOUND])
{
    float *l[N_BOUND] = { f->x,    f->h,    f->o,       f->q,       f->att,     f->k,       f->v,     f->gate,
                          f->up,   f->kall[0], f->vall[0], f->kall[1], f->vall[1], f->row, (float *)f->sel_buf,
                          (float *)f->bits_buf };
    memcpy(out, l, sizeof l);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Scratch in whole pages of their own: a device backend page-locks the buffers it binds, which
 * fails for a buffer sharing a page with one already locked. */
static size_t scratch_size(size_t n) { return (n * sizeof(float) + 4095) & ~(size_t)4095; }

static float *alloc_f(fwd_ctx *f, size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, scratch_size(n))) return NULL;
    f->scratch_bytes += scratch_size(n);
    return p;
}

/* Bind n floats at p to the backend. Rows only ops write (every scratch buffer but the selections'
 * and their bitmaps, which start zeroed) are bound blank: without, a fresh buffer's host bytes
 * count, and an op's first write of a chunk's rows sends the rest of it up (a 7B's first prompt:
 * some 370 MiB of nothing). Page-locked either way: the host reads them back a chunk at a time. */
static int bind_f(fwd_ctx *f, float *p, size_t n, int blank, char *err, size_t errlen)
{
    size_t bytes = n * sizeof(float);
    return blank ? be_bind_blank(f->b, p, bytes, 1, err, errlen) : be_bind(f->b, p, bytes, err, errlen);
}

static int grow_defer(fwd_ctx *f);

/* A buffer of n floats from alloc_f, given back (NULL: none). */
static void free_f(fwd_ctx *f, float *p, size_t n)
{
    if (!p) return;
    f->scratch_bytes -= scratch_size(n);
    free(p);
}

fwd_ctx *fwd_create(const model *m, be_backend *b, const fwd_opts *o, char *err, size_t errlen)
{
    const model_hparams *hp = &m->hp;
    fwd_ctx *f = calloc(1, sizeof *f);
    if (!f) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    f->m = m;
    f->b = b;
    int64_t n_ctx = o && o->n_ctx > 0 ? o->n_ctx : hp->n_ctx_train;
    f->n_batch = o && o->n_batch > 0 ? o->n_batch : 512;
    if (f->n_batch > n_ctx) f->n_batch = (int)n_ctx;
    int64_t kvd = (int64_t)hp->n_head_kv * hp->head_dim;
    if (hp->n_head_kv > 64) {
        snprintf(err, errlen, "%d KV heads: kvchat supports at most 64", hp->n_head_kv);
        free(f);
        return NULL;
    }
    int32_t *win = calloc((size_t)hp->n_layer, sizeof *win);
    f->global = calloc((size_t)hp->n_layer, sizeof *f->global);
    if (!win || !f->global) {
        free(win);
        free(f->global);
        free(f);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    for (int il = 0; il < hp->n_layer; il++) {
        win[il] = m->layers[il].is_swa ? hp->n_swa : 0;
        if (!win[il]) f->global[f->n_global++] = il;
    }
    f->kv = kv_create(hp->n_layer, n_ctx, hp->n_head_kv, hp->head_dim, o && o->page_size > 0 ? o->page_size : 32, win,
                      err, errlen);
    free(win);
    if (!f->kv) {
        free(f->global);
        free(f);
        return NULL;
    }
    size_t B = (size_t)f->n_batch + MAX_PROBE;
    size_t HD = (size_t)hp->n_head * (size_t)hp->head_dim;
    f->x = alloc_f(f, B * (size_t)hp->n_embd);
    f->h = alloc_f(f, B * (size_t)hp->n_embd);
    f->o = alloc_f(f, B * (size_t)hp->n_embd);
    f->q = alloc_f(f, B * HD);
    f->att = alloc_f(f, B * HD);
    f->k = alloc_f(f, B * (size_t)kvd);
    f->v = alloc_f(f, B * (size_t)kvd);
    /* a decode step's rows; grown for a chunk's once bound (grow_defer) */
    f->defer_cap = 1;
    size_t all = (size_t)hp->n_layer * (size_t)kvd;
    for (int i = 0; i < 2; i++) {
        f->kall[i] = alloc_f(f, all);
        f->vall[i] = alloc_f(f, all);
    }
    f->gate = alloc_f(f, B * (size_t)hp->n_ff);
    f->up = alloc_f(f, B * (size_t)hp->n_ff);
    f->out_rows = f->n_batch < OUT_ROWS ? f->n_batch : OUT_ROWS;
    f->logits = alloc_f(f, (size_t)f->out_rows * (size_t)hp->n_vocab);
    f->row = alloc_f(f, (size_t)hp->n_vocab);
    size_t sel_n = (size_t)hp->n_layer * (size_t)hp->n_head_kv * (BE_PICK_MAX + 1);
    f->sel_buf = (int32_t *)alloc_f(f, sel_n);   /* int32s, as many as floats */
    if (f->sel_buf) memset(f->sel_buf, 0, sizeof(int32_t) * sel_n);
    /* a bitmap word per 64 positions of the context, a layer's heads each (at most BITS_MAX_BYTES:
     * beyond, SentKV's choice comes back to the host every layer) */
    f->bits_words = (n_ctx + 63) / 64;
    size_t per_word = (size_t)(f->n_global > 0 ? f->n_global : 1) * (size_t)hp->n_head_kv * sizeof(uint64_t);
    if ((size_t)f->bits_words * per_word > BITS_MAX_BYTES) f->bits_words = (int64_t)(BITS_MAX_BYTES / per_word);
    size_t bits_n = 2 * (size_t)f->bits_words * (size_t)f->n_global * (size_t)hp->n_head_kv;   /* in floats */
    f->bits_buf = (uint64_t *)alloc_f(f, bits_n > 0 ? bits_n : 2);
    if (f->bits_buf) memset(f->bits_buf, 0, sizeof(float) * (bits_n > 0 ? bits_n : 2));
    f->dsel = calloc((size_t)hp->n_layer, sizeof *f->dsel);
    f->pos = malloc(B * sizeof(int32_t));
    f->tok = malloc(B * sizeof(int32_t));
    f->lists = calloc((size_t)hp->n_layer, sizeof *f->lists);
    f->spans = calloc((size_t)hp->n_layer, sizeof *f->spans);
    f->sels = calloc((size_t)hp->n_layer, sizeof *f->sels);
    f->pend.at = -1;
    static _Atomic uint64_t contexts;
    f->serial = ++contexts;
    if (!f->x || !f->h || !f->o || !f->q || !f->att || !f->k || !f->v || !f->kall[0] || !f->vall[0] || !f->kall[1] ||
        !f->vall[1] || !f->gate || !f->up ||
        !f->logits || !f->row || !f->sel_buf || !f->bits_buf || !f->dsel || !f->pos || !f->tok || !f->lists || !f->spans ||
        !f->sels) {
        fwd_free(f);
        snprintf(err, errlen, "out of memory allocating forward buffers");
        return NULL;
    }
    /* The activations a device backend keeps on the device between ops (the logits asked for
     * come back to the host every time, so they stay unbound; a picked step's stay in row). */
    size_t sz[N_BOUND] = { B * (size_t)hp->n_embd, B * (size_t)hp->n_embd, B * (size_t)hp->n_embd, B * HD, B * HD,
                           B * (size_t)kvd, B * (size_t)kvd, B * (size_t)hp->n_ff, B * (size_t)hp->n_ff,
                           all, all, all, all, (size_t)hp->n_vocab, sel_n, bits_n > 0 ? bits_n : 2 };
    float *bufs[N_BOUND];
    bound_bufs(f, bufs);
    for (int i = 0; i < N_BOUND; i++) {
        if (bind_f(f, bufs[i], sz[i], bufs[i] != (float *)f->sel_buf && bufs[i] != (float *)f->bits_buf, err, errlen)) {
            fwd_free(f);
            return NULL;
        }
        f->n_bound = i + 1;
    }
    /* A prompt's chunks run their layers without the host in buffers of a chunk's rows, grown now:
     * page-locking them at a prompt's first chunk cost that prompt about 17 ms on the default model
     * and 120 ms on a 7B (256 MiB) on an H200 (docs/gpu.md). Where they do not fit, chunks wait a
     * layer at a time and decode steps use the one-row buffers (without room now, the first chunk
     * tries again). */
    if (b->ops->bind && f->n_batch > 1) f->grow_retry = grow_defer(f) == -1;
    return f;
}

void fwd_free(fwd_ctx *f)
{
    if (!f) return;
    for (int i = 0; i < f->n_forks; i++) f->forks[i]->origin = NULL;
    free(f->forks);
    free(f->fork_np);
    if (f->origin) {   /* off its source's list of forks */
        fwd_ctx *o = f->origin;
        for (int i = 0; i < o->n_forks; i++)
            if (o->forks[i] == f) o->forks[i] = o->forks[--o->n_forks];
    }
    float *bufs[N_BOUND];
    bound_bufs(f, bufs);
    for (int i = 0; i < f->n_bound; i++) be_unbind(f->b, bufs[i]);
    if (f->batch_rows) {
        be_unbind(f->b, f->batch_rows);
        free(f->batch_rows);
    }
    kv_free(f->kv);
    free(f->x);
    free(f->h);
    free(f->o);
    free(f->q);
    free(f->att);
    free(f->k);
    free(f->v);
    for (int i = 0; i < 2; i++) {
        free(f->kall[i]);
        free(f->vall[i]);
    }
    free(f->gate);
    free(f->up);
    free(f->logits);
    free(f->row);
    free(f->sel_buf);
    free(f->bits_buf);
    free(f->dsel);
    free(f->pos);
    free(f->tok);
    free(f->global);
    free(f->boundary);
    if (f->sels)
        for (int il = 0; il < f->m->hp.n_layer; il++) sel_list_free(&f->sels[il]);
    free(f->sels);
    free(f->page_rows);
    if (f->lists)
        for (int il = 0; il < f->m->hp.n_layer; il++) page_list_free(&f->lists[il]);
    free(f->lists);
    if (f->spans)
        for (int il = 0; il < f->m->hp.n_layer; il++) page_spans_free(&f->spans[il]);
    free(f->spans);
    free(f);
}

int64_t fwd_pos(const fwd_ctx *f) { return kv_len(f->kv); }
int64_t fwd_n_ctx(const fwd_ctx *f) { return kv_n_ctx(f->kv); }
const kv_cache *fwd_kv(const fwd_ctx *f) { return f->kv; }
kv_cache *fwd_cache(fwd_ctx *f)
{
    f->row_valid = 0;   /* the caller may replace the cache's contents */
    return f->kv;
}
const model *fwd_model(const fwd_ctx *f) { return f->m; }
uint64_t fwd_scratch_bytes(const fwd_ctx *f) { return f->scratch_bytes; }
void fwd_set_floor(fwd_ctx *f, int64_t pos) { kv_set_floor(f->kv, pos); }
void fwd_set_mark(fwd_ctx *f, int64_t pos) { kv_set_mark(f->kv, pos); }
void fwd_set_policy(fwd_ctx *f, pol_set *ps) { f->pol = ps; }
pol_set *fwd_policy(const fwd_ctx *f) { return f->pol; }

int fwd_adopt_policy(fwd_ctx *f, pol_set *ps, const int32_t *ids, int64_t n, char *err, size_t errlen)
{
    f->pol = ps;
    if (!ps || n <= 0) return 0;
    /* what fwd_eval tells a policy before a prefill: the ids. What a policy does at a prompt's end
     * happens in layer_done, which an adopted prompt skips: SentKV takes its segment summaries in
     * its begin at the first decode step instead. */
    pol_set_begin(ps, ids, n, 0, 0);
    return 0;
}

/* Sentence-boundary weight of each token from the text it stands for: what ends a sentence, a line
 * or a clause (its last non-blank character). */
static float *boundary_weights(const model *m)
{
    int32_t n = m->hp.n_vocab;
    float *w = calloc((size_t)n, sizeof(float));
    if (!w || !m->vocab) return w;
    char buf[64];
    for (int32_t id = 0; id < n; id++) {
        size_t len = tok_piece_text(m->vocab, id, 0, buf, sizeof buf);
        if (len >= sizeof buf) len = sizeof buf - 1;
        while (len > 0 && buf[len - 1] == ' ') len--;
        if (len == 0) {
            size_t raw = tok_piece_text(m->vocab, id, 0, buf, sizeof buf);
            if (raw > 0 && raw < sizeof buf && memchr(buf, '\n', raw)) w[id] = 0.9f;   /* buf is not NUL-terminated */
            continue;
        }
        char c = buf[len - 1];
        w[id] = c == '.' || c == '!' || c == '?' ? 1.0f : c == '\n' ? 0.9f : c == ';' || c == ':' ? 0.6f : c == ',' ? 0.3f : 0.0f;
    }
    return w;
}

static const page_list *fork_source(const pol_env *env, int il, uint64_t *table);

void fwd_policy_env(fwd_ctx *f, pol_env *env)
{
    const model_hparams *hp = &f->m->hp;
    if (!f->boundary) f->boundary = boundary_weights(f->m);
    env->boundary = f->boundary;
    env->n_vocab = hp->n_vocab;
    env->kv = f->kv;
    env->b = f->b;
    env->n_head = hp->n_head;
    env->n_head_kv = hp->n_head_kv;
    env->head_dim = hp->head_dim;
    env->global = f->global;
    env->n_global = f->n_global;
    env->head_sim = NULL;   /* the run hands policies the model's calibration */
    env->trace = NULL;   /* a policy set turns its own on (pol_set_trace) */
    /* selections by bounds left on a device for attention (a backend without residency has them
     * at once, and they take the engine's lists); layer il's at il * n_head_kv * (BE_PICK_MAX + 1) */
    env->sel_buf = f->b->ops->bind ? f->sel_buf : NULL;
    env->bits_buf = f->b->ops->bind ? f->bits_buf : NULL;   /* SentKV's: global layer gl's at gl * n_head_kv * words */
    env->bits_words = f->bits_words;
    env->fork_source = fork_source;
    env->fork_ud = f;
}

int64_t fwd_rewind(fwd_ctx *f, int64_t pos)
{
    if (pos >= kv_len(f->kv)) return kv_len(f->kv);
    f->row_valid = 0;
    return kv_rewind(f->kv, pos);
}

/* The tokens an entry attends: its rows, or those of them its mask has. */
static int64_t tokens_of(const be_kv_page *r)
{
    if (!r->mask) return r->n;
    int64_t c = 0;
    for (int32_t w = 0; w < (r->n + 63) / 64; w++) {
        uint64_t m = r->mask[w];
        if (w == (r->n - 1) / 64 && (r->n & 63)) m &= (1ull << (r->n & 63)) - 1;
        c += bm_popcount(m);
    }
    return c;
}

/* A decode step's statistics for one layer's list: tokens attended, and on global layers the
 * entries given and the pages held. */
static void list_stats(fwd_ctx *f, int is_global, int64_t tokens, int64_t entries, int64_t pages_total)
{
    if (!f->decoding) return;
    f->st_tokens += tokens;
    if (is_global) {
        f->st_pages += entries;
        f->st_pages_total += pages_total;
    }
}

/* A page of KV head h attended in an observed decode step: the policy's page map (and, on the
 * first global layer's first head, this step's pages). */
static void observe_page(fwd_ctx *f, int32_t pos0, int h, int first_global, int P)
{
    pol_set_hit_page(f->pol, pos0);
    if (first_global && h == 0) pol_set_last_add(f->pol, pos0 / P);
}

/* The name layer il's attention lists go by on the backend (be_attn.table). */
static uint64_t layer_table(const fwd_ctx *f, int il) { return (f->serial << 20) | (uint64_t)(il + 1); }

/* 1 when a list of the source's kept with heads at `at` names only pages both tables had at the
 * fork, but its heads' last entries (which the fork's update writes again): no head's list is
 * longer than the head was then. Pages the source added since, or its copy of the shared last
 * page, are in a longer list or at its last entry. */
static int from_before_fork(const fwd_ctx *f, int il, const page_heads *at)
{
    const int H = f->m->hp.n_head_kv;
    for (int h = 0; h < H; h++)
        if (at->end[h] - at->off[h] > f->fork_np[il * H + h]) return 0;
    return 1;
}

/* pol_env.fork_source: the source's list of every page of layer il, where fork_lists would start a
 * list of the fork's as it. */
static const page_list *fork_source(const pol_env *env, int il, uint64_t *table)
{
    const fwd_ctx *f = env->fork_ud;
    const page_list *ol = f && f->origin ? &f->origin->lists[il] : NULL;
    if (!ol || ol->at.shape == 0 || !from_before_fork(f, il, &ol->at)) return NULL;
    *table = layer_table(f->origin, il);
    return ol;
}

/* A fork's lists of layer il that were never built start as its source's, where those name no page
 * the source added after the fork (kv_fork gave the fork's tables the source's shapes, and the
 * pages before each head's last are then the same pages): its first step there rewrites each
 * head's last entries instead of reading every page. Only where the fork uses them (a fork whose
 * policy lists its own pages never does), and while the source lives. Out of memory: built whole.
 * Returns the name of the source's attention list when the list of every page was copied now, for
 * the call's be_attn.from_table (a device backend starts its list as the source's too), else 0. */
static uint64_t fork_lists(fwd_ctx *f, int il, int spans)
{
    if (!f->origin) return 0;
    uint64_t from = 0;
    const page_list *ol = &f->origin->lists[il];
    if (f->lists[il].at.shape == 0 && ol->at.shape != 0 && from_before_fork(f, il, &ol->at) &&
        page_list_copy(&f->lists[il], ol) == 0)
        from = layer_table(f->origin, il);
    /* the page map's spans too, built on the source first where it kept none (a prompt's context
     * that never decoded): built once for every fork instead of once a fork */
    page_spans *os = &f->origin->spans[il];
    if (spans && f->spans[il].at.shape == 0) {
        if (os->at.shape == 0 && page_spans_update(os, f->origin->kv, il)) return from;
        if (from_before_fork(f, il, &os->at)) page_spans_copy(&f->spans[il], os);
    }
    return from;
}

/* Layer il's list of every page (f->lists[il], engine/page_list.h) brought up to date for
 * attention. With stats, records the step's statistics (observed: also the page map). -1: out of
 * memory. */
static int plain_list(fwd_ctx *f, int il, be_attn *a, int stats, int observe, int first_global, int is_global)
{
    const model_hparams *hp = &f->m->hp;
    int Hkv = hp->n_head_kv;
    page_list *L = &f->lists[il];
    const uint64_t from = fork_lists(f, il, stats && observe);
    if (page_list_update(L, f->kv, il)) return -1;
    int64_t tokens = 0;
    for (int h = 0; h < Hkv; h++) tokens += kv_head_tokens(f->kv, il, h);
    int64_t e = L->at.off[Hkv];
    if (stats && observe) {   /* every page attended: the page map's hits from the kept spans */
        page_spans *S = &f->spans[il];
        if (page_spans_update(S, f->kv, il)) return -1;
        for (int h = 0; h < Hkv; h++)
            pol_set_hit_spans(f->pol, S->spans + S->at.off[h], S->at.end[h] - S->at.off[h], S->seq[h],
                              first_global && h == 0);
    }
    a->pages = L->refs;
    a->n_pages = e;
    a->head_pages = L->at.off;
    a->shape = L->at.shape;
    a->from_table = from;
    memset(f->last_listed, 1, sizeof f->last_listed);
    if (stats) list_stats(f, is_global, tokens, e, e);
    return 0;
}

void fwd_place_pages(fwd_ctx *f)
{
    const model_hparams *hp = &f->m->hp;
    if (!f->b->ops->place_pages || kv_len(f->kv) <= 0) return;
    for (int il = 0; il < hp->n_layer; il++) {
        be_attn a;
        memset(&a, 0, sizeof a);
        a.n_head = hp->n_head;
        a.n_head_kv = hp->n_head_kv;
        a.head_dim = hp->head_dim;
        a.table = layer_table(f, il);
        /* out of host memory: the rest is listed and sent by the calls, as without placing */
        if (plain_list(f, il, &a, 0, 0, 0, 0)) return;
        be_place_pages(f->b, &a, 1);
    }
    if (f->pol) pol_set_place(f->pol);   /* a selection's summaries too */
}

/* A selection left where the bounds put it (sel->best): attention gets the layer's list of every
 * page and the selection, to read where it is; the step's statistics wait for its end
 * (sel_stats), when the answers come back with the step's rows (a selection is kept only where
 * the cache stays as it is while decoding, and there a device backend's steps defer their rows).
 * -1: out of memory. */
static int kept_list(fwd_ctx *f, int il, const pol_sel *sel, be_attn *a, int first_global)
{
    int Hkv = f->m->hp.n_head_kv;
    if (plain_list(f, il, a, 0, 0, first_global, 1)) return -1;
    /* the pages' spans for the statistics (kept from step to step: a few entries a head), which
     * then read no page (out of memory: they read the pages) */
    fork_lists(f, il, 1);
    const page_spans *spans = page_spans_update(&f->spans[il], f->kv, il) ? NULL : &f->spans[il];
    a->sel_best = sel->best;
    a->sel_n_best = sel->n_best;
    a->sel_from = sel->from;
    a->sel_k = sel->k;
    struct dsel *d = &f->dsel[f->n_dsel++];
    memset(d, 0, sizeof *d);   /* the slot may hold an earlier step's choice of tokens (kept_bits) */
    d->il = il;
    d->best = sel->best;
    d->n_best = sel->n_best;
    d->k = sel->k;
    d->spans = spans;
    memcpy(d->from, sel->from, sizeof(int64_t) * (size_t)Hkv);
    return 0;
}

/* A choice of tokens left where the bounds put it (sel->bits): attention gets the layer's list of
 * every page and the bitmaps, to read where they are; the statistics wait for the step's end
 * (sel_stats), as kept_list's. -1: out of memory. */
static int kept_bits(fwd_ctx *f, int il, const pol_sel *sel, be_attn *a, int first_global)
{
    if (plain_list(f, il, a, 0, 0, first_global, 1)) return -1;
    a->sel_bits = sel->bits;
    a->sel_words = sel->words;
    a->sel_page_tokens = kv_page_size(f->kv);
    struct dsel *d = &f->dsel[f->n_dsel++];
    memset(d, 0, sizeof *d);
    d->il = il;
    d->bits = sel->bits;
    d->words = sel->words;
    d->spans = sel->spans;
    return 0;
}

/* The bytes this step's kept selections were written to (pol_env.sel_buf: a slot a layer, its best
 * then its counts; the kept layers ascending). */
static int sel_ranges(const fwd_ctx *f, be_range *out)
{
    const int H = f->m->hp.n_head_kv;
    const int32_t *lo = NULL, *hi = NULL;
    const uint64_t *blo = NULL, *bhi = NULL;
    for (int i = 0; i < f->n_dsel; i++) {
        const struct dsel *d = &f->dsel[i];
        if (d->bits) {
            if (!blo || d->bits < blo) blo = d->bits;
            if (!bhi || d->bits + H * d->words > bhi) bhi = d->bits + H * d->words;
            continue;
        }
        if (!lo || d->best < lo) lo = d->best;
        if (!hi || d->n_best + H > hi) hi = d->n_best + H;
    }
    int n = 0;
    if (lo) out[n++] = (be_range){ lo, sizeof(int32_t) * (size_t)(hi - lo) };
    if (blo) out[n++] = (be_range){ blo, sizeof(uint64_t) * (size_t)(bhi - blo) };
    return n;
}

/* Fill a->pages / head_pages for layer il, one list per KV head (each head has its own page table):
 * the policy's selection on global layers during decode, else every page the head holds. A shared
 * selection's indices apply to every head's table. Records the step's attention statistics.
 * -1: out of memory. */
static int build_page_list(fwd_ctx *f, int il, const float *q, be_attn *a, int is_global)
{
    const model_hparams *hp = &f->m->hp;
    int Hkv = hp->n_head_kv, P = kv_page_size(f->kv);
    const pol_sel *sel = NULL;
    int observe = f->decoding && is_global && f->pol;
    if (observe) {
        double t0 = now_ms();
        sel = pol_set_select(f->pol, il, q);
        f->st_sel_ms += now_ms() - t0;
    }
    int first_global = f->n_global > 0 && il == f->global[0];
    if (observe && first_global) pol_set_last_reset(f->pol);
    a->table = layer_table(f, il);
    if (!sel) return plain_list(f, il, a, 1, observe, first_global, is_global);
    if (sel->best) return kept_list(f, il, sel, a, first_global);
    if (sel->bits) return kept_bits(f, il, sel, a, first_global);
    /* the selection: observed, since only a decode step on a global layer under a policy selects;
     * its list kept from the last step's, whose entries of the same pages are copied (a selection
     * that keeps most of its pages reads few of them), under a shape of its own that says where it
     * only grew at each head's end (a device then looks at the heads' last entries only) */
    sel_list *S = &f->sels[il];
    if (sel_list_update(S, f->kv, il, sel->per_head, sel->off, sel->idx, sel->mask)) return -1;
    int64_t e = S->hp[Hkv], tokens = 0, pages_total = 0;
    for (int h = 0; h < Hkv; h++) {
        const int np = kv_n_pages(f->kv, il, h);
        pages_total += np;
        f->last_listed[h] = 0;
        for (int64_t j = S->hp[h]; j < S->hp[h + 1]; j++) {
            if (S->idx[j] == np - 1) f->last_listed[h] = 1;
            tokens += tokens_of(&S->refs[j]);
            observe_page(f, S->first[j], h, first_global, P);
        }
    }
    a->pages = S->refs;
    a->n_pages = e;
    a->head_pages = S->hp;
    a->shape = S->shape;
    list_stats(f, is_global, tokens, e, pages_total);
    return 0;
}

/* A deferred decode step's statistics, as if its token were already in the cache: its row is
 * attended beside the pages; the page it goes into counts as attended where the list left it out
 * (a selection that chose none of its other tokens), and one it will open counts as attended and
 * held (and both, on the first global layer, as this step's page for the page map). */
static void defer_stats(fwd_ctx *f, int il, int is_global, int64_t p0, const unsigned char *last_listed)
{
    int Hkv = f->m->hp.n_head_kv, P = kv_page_size(f->kv);
    f->st_tokens += Hkv;
    if (!is_global) return;
    int observe = f->pol != NULL, first_global = f->n_global > 0 && il == f->global[0];
    for (int h = 0; h < Hkv; h++) {
        int opens = kv_next_row_opens_page(f->kv, il, h);
        if (!opens && last_listed[h]) continue;
        int64_t first = p0;
        if (!opens) {
            const kv_page *p = kv_layer_page(f->kv, il, h, kv_n_pages(f->kv, il, h) - 1);
            if (p->n > 0) first = p->pos[0];
        }
        f->st_pages++;
        f->st_pages_total += opens;
        if (observe) observe_page(f, (int32_t)first, h, first_global, P);
    }
}

/* One page of a kept selection, for the step's statistics (the page map, as build_page_list
 * observes a selection's pages); its tokens. S: the layer's spans as the selection was made, read
 * instead of the page (a header a page: a cache miss each, thousands a step at 32K); NULL: the
 * page. */
static int64_t sel_page(fwd_ctx *f, int il, int h, int64_t idx, int first_global, const page_spans *S)
{
    if (S) {   /* the layer's spans, as the selection was made: no page looked at */
        if (idx < 0 || idx >= S->at.end[h] - S->at.off[h]) return -1;
        const page_span *sp = &S->spans[S->at.off[h] + idx];
        observe_page(f, sp->first, h, first_global, kv_page_size(f->kv));
        return sp->n;
    }
    if (idx < 0 || idx >= kv_n_pages(f->kv, il, h)) return -1;   /* never, from a working backend */
    const kv_page *p = kv_layer_page(f->kv, il, h, (int)idx);
    observe_page(f, p->pos[0], h, first_global, kv_page_size(f->kv));
    return p->n;
}

/* A kept choice of tokens' statistics (sel_stats): the pages with a chosen token, walked through
 * the layer's spans from one chosen position to the next, as the policy builds its lists on the
 * host (a page of consecutive positions counted a word at a time, any other token by token). */
static void bits_stats(fwd_ctx *f, const struct dsel *d, int first_global, int64_t p0)
{
    int Hkv = f->m->hp.n_head_kv, P = kv_page_size(f->kv);
    int64_t tokens = 0, entries = 0, pages_total = 0;
    unsigned char last_listed[64];
    const page_spans *sp = d->spans;
    for (int h = 0; h < Hkv; h++) {
        const uint64_t *bm = d->bits + (int64_t)h * d->words;
        const page_span *span = sp->spans + sp->at.off[h];
        int np = (int)(sp->at.end[h] - sp->at.off[h]);
        pages_total += np;
        last_listed[h] = 0;
        int64_t a = 0;
        for (int i = 0; (i = page_spans_next_chosen(span, np, i, bm, d->words, &a)) >= 0; i++) {
            page_span at = span[i];
            int32_t on = 0;
            if ((int64_t)at.last - at.first == at.n - 1) {
                on = (int32_t)bm_count(bm, d->words, at.first, (int64_t)at.last + 1);
            } else {
                const kv_page *p = kv_layer_page(f->kv, d->il, h, i);
                for (int32_t t = 0; t < p->n; t++) on += bm_bit(bm, d->words, p->pos[t]);
            }
            if (on) {
                tokens += on;
                entries++;
                observe_page(f, at.first, h, first_global, P);
                if (i == np - 1) last_listed[h] = 1;
            }
        }
    }
    list_stats(f, 1, tokens, entries, pages_total);
    if (d->row) defer_stats(f, d->il, 1, p0, last_listed);
}

/* The statistics of this step's layers whose selection stayed with the backend (kept_list), now
 * that the answers are on the host, before the cache takes the step's row: what build_page_list
 * records for a selection, then what defer_stats records for the row. */
static void sel_stats(fwd_ctx *f, int64_t p0)
{
    int Hkv = f->m->hp.n_head_kv;
    for (int i = 0; i < f->n_dsel; i++) {
        const struct dsel *d = &f->dsel[i];
        int first_global = f->n_global > 0 && d->il == f->global[0];
        if (d->bits) {
            bits_stats(f, d, first_global, p0);
            if (f->pol) pol_set_chosen(f->pol, d->il, d->bits, d->words);
            continue;
        }
        int64_t tokens = 0, entries = 0, pages_total = 0;
        unsigned char last_listed[64];   /* a head's last page is attended when past the candidates */
        for (int h = 0; h < Hkv; h++) {
            int np = kv_n_pages(f->kv, d->il, h);
            pages_total += np;
            last_listed[h] = d->from[h] < np;
            int64_t got;
            for (int32_t j = 0; j < d->n_best[h] && j < d->k; j++)
                if ((got = sel_page(f, d->il, h, d->best[(int64_t)h * d->k + j], first_global, d->spans)) >= 0) {
                    tokens += got;
                    entries++;
                }
            for (int64_t idx = d->from[h]; idx < np; idx++)
                if ((got = sel_page(f, d->il, h, idx, first_global, d->spans)) >= 0) {
                    tokens += got;
                    entries++;
                }
        }
        list_stats(f, 1, tokens, entries, pages_total);
        if (d->row) defer_stats(f, d->il, 1, p0, last_listed);
    }
    f->n_dsel = 0;
}

/* Most bytes one of the four deferred-row buffers may take when they grow to a chunk's rows (each
 * is page-locked on the host and has a twin on the device); a chunk that would need more waits a
 * layer at a time instead. */
#define DEFER_MAX_BYTES ((size_t)256 << 20)

/* Room for n_batch deferred rows a layer in both sets, allocated and bound before the 1-row ones
 * go (nothing may be pending). 0; -1 when there is no room for them (host or device memory, said
 * never: the chunks then wait a layer at a time; a device's failed bind is not an op failure); -2
 * when they would pass DEFER_MAX_BYTES. */
static int grow_defer(fwd_ctx *f)
{
    const model_hparams *hp = &f->m->hp;
    size_t kvd = (size_t)hp->n_head_kv * (size_t)hp->head_dim, rows = (size_t)f->n_batch;
    size_t all = (size_t)hp->n_layer * rows * kvd, bytes = all * sizeof(float);
    if (bytes > DEFER_MAX_BYTES) return -2;
    float *nb[4] = { 0 };
    int bound = 0;
    char err[256];
    for (; bound < 4; bound++) {
        nb[bound] = alloc_f(f, all);
        if (!nb[bound] || bind_f(f, nb[bound], all, 1, err, sizeof err)) break;
    }
    if (bound < 4) {
        for (int i = 0; i <= bound; i++) {
            if (i < bound) be_unbind(f->b, nb[i]);
            free_f(f, nb[i], all);
        }
        return -1;
    }
    size_t old = (size_t)hp->n_layer * (size_t)f->defer_cap * kvd;
    float **sets[4] = { &f->kall[0], &f->vall[0], &f->kall[1], &f->vall[1] };
    for (int i = 0; i < 4; i++) {
        be_unbind(f->b, *sets[i]);
        free_f(f, *sets[i], old);
        *sets[i] = nb[i];
    }
    f->defer_cap = f->n_batch;
    return 0;
}

/* Deferred rows of set `set`, n a layer, every layer's: the keys' range and the values'. */
static void set_ranges(const fwd_ctx *f, int set, int64_t n, be_range rd[2])
{
    const model_hparams *hp = &f->m->hp;
    size_t bytes = sizeof(float) * (size_t)hp->n_layer * (size_t)n * (size_t)hp->n_head_kv * (size_t)hp->head_dim;
    rd[0] = (be_range){ f->kall[set], bytes };
    rd[1] = (be_range){ f->vall[set], bytes };
}

/* The rows the cache has just taken into layer il from the bound rows K, V (the last n of each KV
 * head's table; row t of head h at K + t * kvd + h * head_dim, at position p0 + t), named to a
 * device backend that writes them into its copies of the pages from its twins instead of sending
 * the host's rows up at the layer's next attention call (be_ops.page_rows). A prompt's chunks only:
 * a decode step's one row a head is sent as it is. Out of memory for the list, nothing is named and
 * the rows go up as before. */
static void name_page_rows(fwd_ctx *f, int il, const float *K, const float *V, int64_t n, int64_t p0)
{
    if (!f->b->ops->page_rows || n < 2) return;
    const model_hparams *hp = &f->m->hp;
    const int H = hp->n_head_kv, D = (int)hp->head_dim, P = kv_page_size(f->kv);
    const int64_t kvd = (int64_t)H * D, cap = (int64_t)H * (n / P + 2);
    if (cap > f->page_rows_cap) {
        be_page_rows *nb = realloc(f->page_rows, sizeof *nb * (size_t)cap);
        if (!nb) return;
        f->page_rows = nb;
        f->page_rows_cap = cap;
    }
    int m = 0;
    for (int h = 0; h < H; h++) {
        int64_t left = n;   /* rows [0, left) of the chunk not named yet: those before the page's */
        for (int i = kv_n_pages(f->kv, il, h) - 1; i >= 0 && left > 0; i--) {
            const kv_page *p = kv_layer_page(f->kv, il, h, i);
            const int32_t take = p->n < left ? p->n : (int32_t)left;
            left -= take;
            be_page_rows *e = &f->page_rows[m++];
            page_list_ref(&e->page, p, NULL, D, P);
            e->row0 = p->n - take;
            e->n = take;
            e->pos0 = (int32_t)(p0 + left);
            e->k = K + left * kvd + (int64_t)h * D;
            e->v = V + left * kvd + (int64_t)h * D;
            e->stride = kvd;
        }
    }
    f->b->ops->page_rows(f->b, f->page_rows, m);
}

/* The pending rows (f->pend), every layer's: read on the host (once; the wait brings in what the
 * end of their chunk fetched), then layers [pend.layers, upto) taken into the cache. 0, -2 when
 * the cache cannot grow, -4 when a backend op failed. */
static int take_pending(fwd_ctx *f, int upto)
{
    const model_hparams *hp = &f->m->hp;
    int64_t kvd = (int64_t)hp->n_head_kv * hp->head_dim, n = f->pend.n;
    const float *K = f->kall[f->pend.set], *V = f->vall[f->pend.set];
    /* whose rows: this context's n, or a batch's sequences' one each */
    int n_seq = f->pend.n_seq ? f->pend.n_seq : 1;
    fwd_ctx *const *seqs = f->pend.n_seq ? f->pend.seqs : &f;
    if (!f->pend.read) {
        be_range rd[2 + 2 * FWD_BATCH_MAX];
        set_ranges(f, f->pend.set, n, rd);
        int nr = 2;
        for (int s = 0; s < n_seq; s++)
            if (seqs[s]->n_dsel) nr += sel_ranges(seqs[s], rd + nr);   /* this step's kept selections, for sel_stats */
        be_host_read(f->b, rd, nr);
        if (be_failed(f->b, f->dev_err, sizeof f->dev_err)) return -4;
        f->pend.read = 1;
    }
    for (int s = 0; s < n_seq; s++)   /* before the cache takes the step's row */
        if (seqs[s]->n_dsel) sel_stats(seqs[s], f->pend.n_seq ? seqs[s]->eval_start : f->pend.at);
    for (; f->pend.layers < upto; f->pend.layers++) {
        int64_t off = f->pend.layers * n * kvd;
        if (!f->pend.n_seq) {
            if (kv_append_on(f->kv, f->b, f->pend.layers, K + off, V + off, n, f->pend.at) != 0) return -2;
            name_page_rows(f, f->pend.layers, K + off, V + off, n, f->pend.at);
            continue;
        }
        for (int s = 0; s < n_seq; s++)
            if (kv_append_on(seqs[s]->kv, f->b, f->pend.layers, K + off + s * kvd, V + off + s * kvd, 1,
                             seqs[s]->eval_start))
                return -2;
    }
    if (f->pend.layers == hp->n_layer) f->pend.at = -1;
    return 0;
}

/* Layer il's attention call for sequence f's rows (its queries q at positions pos: n_chunk of its
 * own from p0, then n_probe probe rows; K/V their new rows) into out, as *a: the window trimmed, the
 * page list built, the step's statistics recorded. With defer the rows' own K/V are attended from
 * where they are, beside the cache's pages (forward_rows). 0 or -2 (out of memory). */
static int attend_call(fwd_ctx *f, int il, float *q, const int32_t *pos, int64_t n_chunk, int64_t p0,
                       int64_t n_probe, float *K, float *V, int defer, float *out, be_attn *a)
{
    const model_hparams *hp = &f->m->hp;
    const model_layer *ly = &f->m->layers[il];
    int64_t n = n_chunk + n_probe;
    kv_trim_window(f->kv, il, p0, f->eval_start);
    *a = (be_attn){
        .q = q, .n_q = n, .q_pos = pos, .n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
        .window = ly->is_swa ? hp->n_swa : 0, .out = out,
    };
    if (defer) {
        a->cur_k = K;
        a->cur_v = V;
        a->cur_pos = pos;
        a->n_cur = n;
    }
    if (build_page_list(f, il, q, a, !ly->is_swa) != 0) return -2;
    if (defer && f->decoding) {
        if (f->n_dsel && f->dsel[f->n_dsel - 1].il == il)
            f->dsel[f->n_dsel - 1].row = 1;   /* counted after the selection's pages (sel_stats) */
        else
            defer_stats(f, il, !ly->is_swa, p0, f->last_listed);
    }
    return 0;
}

/* Sequence f's chunk as its policies see it (f->pol set): n rows from p0, then n_probe probe rows
 * from probe_p0, their queries q (NULL before the layers have run). */
static pol_chunk policy_chunk(const fwd_ctx *f, const float *q, int64_t n, int64_t p0, int64_t n_probe,
                              int64_t probe_p0)
{
    return (pol_chunk){ q, n, p0, n_probe, probe_p0, pol_set_probe_tokens(f->pol), f->last_chunk, f->decoding };
}

/* What follows sequence f's attention call of layer il (attend_call's arguments): the probe rows'
 * K/V dropped, a prefill policy told the layer is done. 0, -2 or -3 (as forward_rows). */
static int attend_done(fwd_ctx *f, int il, float *q, int64_t n_chunk, int64_t p0, int64_t n_probe,
                       int64_t probe_p0, int defer)
{
    if (n_probe && kv_truncate_layer(f->kv, il, probe_p0)) return -2;
    if (f->pol && !f->m->layers[il].is_swa && !defer) {
        pol_chunk c = policy_chunk(f, q, n_chunk, p0, n_probe, probe_p0);
        if (pol_set_layer_done(f->pol, il, &c, f->pol_err, sizeof f->pol_err)) return -3;
    }
    return 0;
}

/* Layer il's attention for f's own rows (attend_call's arguments), or 0 .. as forward_rows. */
static int attend(fwd_ctx *f, int il, float *q, const int32_t *pos, int64_t n_chunk, int64_t p0, int64_t n_probe,
                  int64_t probe_p0, float *K, float *V, int defer, float *out)
{
    be_attn a;
    if (attend_call(f, il, q, pos, n_chunk, p0, n_probe, K, V, defer, out, &a)) return -2;
    double t0 = f->decoding ? now_ms() : 0;
    f->b->ops->attention(f->b, &a);
    if (f->decoding) f->st_attn_ms += now_ms() - t0;
    return attend_done(f, il, q, n_chunk, p0, n_probe, probe_p0, defer);
}

/* Layer il's attention for a batch's decode step: each sequence's call made as attend's, then all
 * of them at once (be_attention_seqs: one launch on a device backend), the call's time shared
 * evenly among the sequences' statistics. 0 .. as forward_rows. */
_Static_assert(FWD_BATCH_MAX <= BE_ATTN_SEQS_MAX, "a batch's attention calls must fit one joined launch");

static int attend_batch(fwd_ctx *f, fwd_ctx *const *seqs, int n_seq, int il, float *K, float *V, int defer)
{
    const model_hparams *hp = &f->m->hp;
    const int64_t HD = (int64_t)hp->n_head * hp->head_dim, kvd = (int64_t)hp->n_head_kv * hp->head_dim;
    be_attn a[FWD_BATCH_MAX];
    for (int s = 0; s < n_seq; s++)
        if (attend_call(seqs[s], il, f->q + s * HD, f->pos + s, 1, f->pos[s], 0, K + s * kvd, V + s * kvd, defer,
                        f->att + s * HD, &a[s]))
            return -2;
    double t0 = now_ms();
    be_attention_seqs(f->b, a, n_seq);
    double share = (now_ms() - t0) / n_seq;
    int rc = 0;
    for (int s = 0; s < n_seq && !rc; s++) {
        if (seqs[s]->decoding) seqs[s]->st_attn_ms += share;
        rc = attend_done(seqs[s], il, f->q + s * HD, 1, f->pos[s], 0, 0, defer);
    }
    return rc;
}

/* The rows of one forward pass through f's scratch: either f's own chunk of n tokens at positions
 * p0 .. p0+n-1 (n_seq 0; a prefill policy's probe rows after them), or a batch's decode steps, row s
 * the token of seqs[s] (n_seq of them, n == n_seq) at its own next position. Leaves the final hidden
 * states in f->x. Returns -1 if *abort_flag was raised (checked before every layer, so Ctrl-C
 * answers within a layer's time even on long chunks), -2 when a cache cannot grow (out of memory),
 * -3 when a policy failed (its pol_err), -4 when a backend op failed (f->dev_err); the caller then
 * rewinds the caches. */
static int forward_rows(fwd_ctx *f, fwd_ctx *const *seqs, int n_seq, const int32_t *tokens, int64_t n, int64_t p0,
                        const int32_t *probe, int64_t n_probe, int64_t probe_p0, volatile sig_atomic_t *abort_flag)
{
    const model *m = f->m;
    const model_hparams *hp = &m->hp;
    const be_ops *op = f->b->ops;
    be_backend *b = f->b;
    int64_t E = hp->n_embd, D = hp->head_dim, H = hp->n_head, Hkv = hp->n_head_kv;
    int64_t kvd = Hkv * D;
    const int batch = n_seq > 0;
    if (!batch) {
        seqs = &f;
        n_seq = 1;
    }
    /* Probe rows (a prefill policy's question tokens at their own positions) run through every layer
     * after the chunk's rows and attend like them, but leave no K/V behind. */
    for (int64_t t = 0; t < n; t++) f->pos[t] = (int32_t)(batch ? seqs[t]->eval_start : p0 + t);
    for (int64_t t = 0; t < n_probe; t++) f->pos[n + t] = (int32_t)(probe_p0 + t);
    memcpy(f->tok, tokens, sizeof(int32_t) * (size_t)n);
    if (n_probe) memcpy(f->tok + n, probe, sizeof(int32_t) * (size_t)n_probe);
    tokens = f->tok;
    int64_t n_chunk = n;
    n += n_probe;

    /* A decode step or prefill chunk on a device backend, with no policy needing its rows in the
     * cache between layers (a decode step's selection lists the pages without them): the layers
     * run without waiting for the host (attention takes the chunk's own K/V rows from the device,
     * after the pages), and the cache takes every layer's rows after the last layer, with one wait
     * a chunk instead of one a layer (SentKV, whose choice is made on the host, still waits for
     * its bounds once a global layer). A batch defers when each of its sequences would. */
    int defer = b->ops->bind && n_probe == 0;
    for (int s = 0; s < n_seq && defer; s++) {
        const fwd_ctx *q = seqs[s];
        defer = q->decoding ? (batch || n == 1) && (!q->pol || pol_set_decode_can_defer(q->pol))
                            : !q->pol || pol_set_prefill_layer_free(q->pol);
    }
    /* Rows past the buffers' (grown at creation where they fit, grow_defer) go a layer at a time;
     * where the device had no room then (a context made beside the one it replaces, reopen_fwd),
     * the first such chunk tries once more. The previous chunk's rows, if still pending: a chunk
     * that defers takes them into the cache a layer at a time, just before that layer's attention
     * (the host's work overlapping the device's on earlier layers); one that does not, all of them
     * now (and one that grows the buffers, before they go). */
    int grow = defer && n > f->defer_cap && f->grow_retry;
    if (grow) f->grow_retry = 0;
    int rc = f->pend.at >= 0 && (!defer || grow) ? take_pending(f, hp->n_layer) : 0;
    if (rc) return rc;
    if (grow && grow_defer(f)) defer = 0;
    if (defer && n > f->defer_cap) defer = 0;
    const int set = f->next_set;
    /* the rows of the queries a policy reads on global layers, [q_r0, q_r1): only those come back
     * from a device (TAKE's probe: 32 of a 544-row chunk); a batch's, every row if one reads its own */
    int64_t q_r0 = 0, q_r1 = 0;
    if (!batch && f->pol) {
        pol_chunk qc = policy_chunk(f, NULL, n_chunk, p0, n_probe, probe_p0);
        pol_set_query_rows(f->pol, &qc, &q_r0, &q_r1);
    }
    for (int s = 0; batch && s < n_seq; s++) {
        if (!seqs[s]->pol) continue;
        int64_t r0, r1;
        pol_chunk qc = policy_chunk(seqs[s], NULL, 1, seqs[s]->eval_start, 0, 0);
        if (pol_set_query_rows(seqs[s]->pol, &qc, &r0, &r1)) q_r0 = 0, q_r1 = n;
    }
    op->get_rows(b, &m->tok_embd, tokens, n, hp->embd_scale, f->x);
    /* each layer's attention norm comes with the residual add before it (add_norm), but the first's */
    op->rmsnorm(b, f->x, m->layers[0].attn_norm, f->h, n, E, hp->norm_eps);
    for (int il = 0; il < hp->n_layer; il++) {
        if (abort_flag && *abort_flag) return -1;
        if (be_failed(b, f->dev_err, sizeof f->dev_err)) return -4;
        const model_layer *ly = &m->layers[il];
        float *K = defer ? f->kall[set] + il * n * kvd : f->k, *V = defer ? f->vall[set] + il * n * kvd : f->v;
        /* attention block (its input norm is in f->h already) */
        be_mm qkv[3] = { { &ly->wq, f->q }, { &ly->wk, K }, { &ly->wv, V } };
        op->matmul(b, qkv, 3, f->h, n);
        be_qk qk = { .q = f->q, .k = K, .n_tok = n, .n_head = (int)H, .n_head_kv = (int)Hkv, .head_dim = (int)D,
                     .q_norm = hp->post_norms ? ly->q_norm : NULL, .k_norm = hp->post_norms ? ly->k_norm : NULL,
                     .eps = hp->norm_eps, .pos = f->pos, .freq_base = ly->rope_base, .freq_scale = hp->rope_freq_scale,
                     .neox = hp->rope_neox, .q_scale = hp->attn_scale };
        op->qk_rope(b, &qk);
        if (!defer) {
            /* the host's share of the layer: the new K/V rows go into the cache, and a policy that
             * reads the queries on global layers gets them (one wait for a device backend; a 7B
             * prefill's queries are twice its K/V rows, so they stay where no policy reads them) */
            be_range rd[3] = { { K, sizeof(float) * (size_t)(n * kvd) }, { V, sizeof(float) * (size_t)(n * kvd) },
                               { f->q + q_r0 * H * D, sizeof(float) * (size_t)((q_r1 - q_r0) * H * D) } };
            be_host_read(b, rd, q_r1 > q_r0 && !ly->is_swa ? 3 : 2);
            /* that waited for the device: a failed op shows now, before the cache or a policy acts
             * on what it left */
            if (be_failed(b, f->dev_err, sizeof f->dev_err)) return -4;
            if (!batch) {
                if (kv_append_on(f->kv, b, il, K, V, n_chunk, p0) != 0) return -2;
                name_page_rows(f, il, K, V, n_chunk, p0);
                if (n_probe && kv_append(f->kv, il, K + n_chunk * kvd, V + n_chunk * kvd, n_probe, probe_p0) != 0)
                    return -2;
            } else {
                for (int s = 0; s < n_seq; s++)
                    if (kv_append_on(seqs[s]->kv, b, il, K + s * kvd, V + s * kvd, 1, f->pos[s]) != 0) return -2;
            }
        } else if (f->pend.at >= 0 && (rc = take_pending(f, il + 1)) != 0) {
            return rc;   /* the previous chunk's rows of this layer (the first waits for the device) */
        }
        rc = batch ? attend_batch(f, seqs, n_seq, il, K, V, defer)
                   : attend(f, il, f->q, f->pos, n_chunk, p0, n_probe, probe_p0, K, V, defer, f->att);
        if (rc) return rc;
        be_mm wo = { &ly->wo, f->o };
        op->matmul(b, &wo, 1, f->att, n);
        op->add_norm(b, f->x, f->o, hp->post_norms ? ly->post_attn_norm : NULL, ly->ffn_norm, f->h, n, E,
                     hp->norm_eps);
        /* feed-forward block */
        be_mm gu[2] = { { &ly->w_gate, f->gate }, { &ly->w_up, f->up } };
        op->matmul(b, gu, 2, f->h, n);
        op->glu(b, f->gate, f->up, n * hp->n_ff, hp->gelu);
        be_mm down = { &ly->w_down, f->o };
        op->matmul(b, &down, 1, f->gate, n);
        /* the next layer's attention norm with the add (the last layer's output norm is taken
         * later, over the rows that need logits) */
        op->add_norm(b, f->x, f->o, hp->post_norms ? ly->post_ffw_norm : NULL,
                     il + 1 < hp->n_layer ? m->layers[il + 1].attn_norm : NULL, f->h, n, E, hp->norm_eps);
    }
    if (defer) {   /* the rows start back now; the cache takes them later (take_pending) */
        be_range rd[2 + 2 * FWD_BATCH_MAX];
        set_ranges(f, set, n, rd);
        int nr = 2;
        for (int s = 0; s < n_seq; s++)
            if (seqs[s]->n_dsel) nr += sel_ranges(seqs[s], rd + nr);
        be_host_prefetch(b, rd, nr);
        f->pend.at = batch ? f->pos[0] : p0;
        f->pend.n = n;
        f->pend.set = set;
        f->pend.read = 0;
        f->pend.layers = 0;
        f->pend.n_seq = batch ? n_seq : 0;
        for (int s = 0; batch && s < n_seq; s++) f->pend.seqs[s] = seqs[s];
        f->next_set = !set;
    }
    return be_failed(b, f->dev_err, sizeof f->dev_err) ? -4 : 0;
}

/* The final soft cap on n logits in host memory. */
static void soft_cap(const model_hparams *hp, float *l, int64_t n)
{
    if (hp->final_softcap <= 0) return;
    float c = hp->final_softcap;
    for (int64_t i = 0; i < n; i++) l[i] = lp_cap(l[i], c);
}

/* Logits for rows [r0, r0+nr) of the chunk's hidden states: into f->logits, soft-capped, or with
 * picks (one a row) into rows (bound: f->row, a batch's batch_rows), left with the backend, and the
 * backend's candidates into picks. 0, or -1 when a backend op failed (f->dev_err). */
static int output_rows(fwd_ctx *f, int64_t r0, int64_t nr, be_pick *picks, float *rows)
{
    const model *m = f->m;
    const model_hparams *hp = &m->hp;
    int64_t E = hp->n_embd;
    f->b->ops->rmsnorm(f->b, f->x + r0 * E, m->output_norm, f->h, nr, E, hp->norm_eps);
    be_mm out = { &m->output, picks ? rows : f->logits };
    f->b->ops->matmul(f->b, &out, 1, f->h, nr);
    for (int64_t i = 0; picks && i < nr; i++) {
        picks[i].logits = rows + i * hp->n_vocab;
        picks[i].n = hp->n_vocab;
        picks[i].softcap = hp->final_softcap;
    }
    if (picks) f->b->ops->pick(f->b, picks, (int)nr);   /* a batch's rows: one wait */
    if (be_failed(f->b, f->dev_err, sizeof f->dev_err)) return -1;
    if (!picks) soft_cap(hp, f->logits, nr * hp->n_vocab);
    return 0;
}

/* The ids an evaluation of f is given, checked: what fits the context and the vocabulary. 0, or -1
 * with a message. */
static int check_ids(const fwd_ctx *f, const int32_t *tokens, int64_t n, char *err, size_t errlen)
{
    const model_hparams *hp = &f->m->hp;
    int64_t start = kv_len(f->kv);
    if (n <= 0) {
        snprintf(err, errlen, "nothing to evaluate");
        return -1;
    }
    if (start + n > kv_n_ctx(f->kv)) {
        snprintf(err, errlen, "%lld tokens do not fit in the context: %lld already used of %lld",
                 (long long)n, (long long)start, (long long)kv_n_ctx(f->kv));
        return -1;
    }
    for (int64_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab) {
            snprintf(err, errlen, "token id %d out of range (vocabulary has %d)", tokens[i], hp->n_vocab);
            return -1;
        }
    }
    return 0;
}

/* An evaluation of n ids begins at f's current length: its statistics start, its policy sees the
 * ids. */
static void begin_eval(fwd_ctx *f, const int32_t *tokens, int64_t n)
{
    int64_t start = kv_len(f->kv);
    f->eval_start = start;
    f->row_valid = 0;
    f->n_dsel = 0;
    if (f->decoding) {
        f->st_pages = f->st_tokens = f->st_pages_total = 0;
        f->st_sel_ms = f->st_attn_ms = 0;
    }
    if (f->pol) {
        double t0 = now_ms();
        pol_set_begin(f->pol, tokens, n, start, f->decoding);
        if (f->decoding) f->st_sel_ms += now_ms() - t0;
    }
}

/* A decode step of f ended: its policy records what it read. */
static void record_step(fwd_ctx *f)
{
    if (!f->pol) return;
    uint64_t bytes = (uint64_t)f->st_tokens * (uint64_t)f->m->hp.head_dim * 2u * sizeof(uint16_t);
    pol_set_record_step(f->pol, f->st_pages, f->st_tokens, bytes, f->st_sel_ms, f->st_attn_ms, f->st_pages_total);
}

/* The message of forward_rows' failure rc (an op that failed before a cancel or another error is
 * reported, and cleared, as the failure), the policy's message pol_err. */
static void failure_message(fwd_ctx *lead, int rc, const char *pol_err, char *err, size_t errlen)
{
    if (rc != -4 && be_failed(lead->b, lead->dev_err, sizeof lead->dev_err)) rc = -4;
    snprintf(err, errlen, "%s",
             rc == -2   ? "out of memory growing the KV cache"
             : rc == -3 ? pol_err
             : rc == -4 ? lead->dev_err
                        : "cancelled");
}

static int eval_tokens(fwd_ctx *f, const int32_t *tokens, int64_t n, float *logits_last, be_pick *pick,
                       fwd_logits_fn each, void *ud, fwd_progress_fn progress, void *pud, volatile sig_atomic_t *abort_flag, char *err,
                       size_t errlen)
{
    const model_hparams *hp = &f->m->hp;
    int64_t start = kv_len(f->kv);
    if (check_ids(f, tokens, n, err, errlen)) return -1;
    begin_eval(f, tokens, n);
    int chunk = f->n_batch;
    if (!f->decoding && f->pol) {
        int want = pol_set_chunk_size(f->pol);
        if (want > 0 && want < chunk) chunk = want;
    }
    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
        int64_t cn = n - c0 < chunk ? n - c0 : chunk;
        f->last_chunk = c0 + cn == n;
        /* a prefill policy's probe: the eval's last tokens (the question), appended to earlier chunks */
        int64_t n_probe = 0;
        if (!f->decoding && f->pol && !f->last_chunk) {
            n_probe = pol_set_probe_tokens(f->pol);
            if (n_probe > MAX_PROBE) n_probe = MAX_PROBE;
            if (n_probe > n - (c0 + cn)) n_probe = n - (c0 + cn);
        }
        int rc = abort_flag && *abort_flag ? -1
                                           : forward_rows(f, NULL, 0, tokens + c0, cn, start + c0, tokens + n - n_probe,
                                                          n_probe, start + n - n_probe, abort_flag);
        if (rc != 0) {
            failure_message(f, rc, f->pol_err, err, errlen);
            f->pend.at = -1;
            f->n_dsel = 0;   /* the step's kept selections count for nothing (SentKV's reuse rate skips it) */
            kv_rewind(f->kv, start);
            return -1;
        }
        if (each) {
            for (int64_t r = 0; r < cn; r += f->out_rows) {
                int64_t nr = cn - r < f->out_rows ? cn - r : f->out_rows;
                if (output_rows(f, r, nr, NULL, NULL)) goto failed;
                for (int64_t i = 0; i < nr; i++) each(ud, start + c0 + r + i, f->logits + i * hp->n_vocab);
            }
            if (logits_last && c0 + cn == n)
                memcpy(logits_last, f->logits + ((cn - 1) % f->out_rows) * hp->n_vocab,
                       sizeof(float) * (size_t)hp->n_vocab);
        } else if (logits_last && c0 + cn == n) {
            if (output_rows(f, cn - 1, 1, NULL, NULL)) goto failed;
            memcpy(logits_last, f->logits, sizeof(float) * (size_t)hp->n_vocab);
        } else if (pick && c0 + cn == n) {
            if (output_rows(f, cn - 1, 1, pick, f->row)) goto failed;
            f->row_valid = 1;
            f->row_at = f->row;
        }
        /* Deferred rows come in with the output's wait (the eval's last chunk, a decode step, a
         * chunk whose logits were asked for); a prompt's other chunks leave theirs to the next
         * chunk, which takes them a layer at a time while the device runs. */
        int ra = f->pend.at >= 0 && (each || f->last_chunk) ? take_pending(f, hp->n_layer) : 0;
        if (ra == -2) snprintf(f->dev_err, sizeof f->dev_err, "out of memory growing the KV cache");
        if (ra) goto failed;
        kv_commit(f->kv, start + c0 + cn);

        if (progress) progress(pud, c0 + cn, n);
    }
    /* A prefill's last chunk kept every page its own queries needed; from now on only queries at the
     * eval's last position and later exist (a rollback by one token included), so sliding-window
     * layers give the rest back now instead of at the next step: memory held after the prompt, and
     * snapshots taken then, hold only the window. */
    if (!f->decoding)
        for (int il = 0; il < hp->n_layer; il++) kv_trim_window(f->kv, il, start + n - 1, start + n - 1);
    if (f->decoding) record_step(f);
    return 0;
failed:
    f->pend.at = -1;
    f->n_dsel = 0;
    kv_rewind(f->kv, start);
    f->row_valid = 0;
    snprintf(err, errlen, "%s", f->dev_err);
    return -1;
}

int fwd_eval(fwd_ctx *f, const int32_t *tokens, int64_t n, float *logits_last, fwd_logits_fn each, void *ud,
             fwd_progress_fn progress, void *pud, volatile sig_atomic_t *abort_flag, char *err, size_t errlen)
{
    f->decoding = 0;
    return eval_tokens(f, tokens, n, logits_last, NULL, each, ud, progress, pud, abort_flag, err, errlen);
}

int fwd_decode(fwd_ctx *f, int32_t token, float *logits, volatile sig_atomic_t *abort_flag, char *err, size_t errlen)
{
    f->decoding = 1;
    int rc = eval_tokens(f, &token, 1, logits, NULL, NULL, NULL, NULL, NULL, abort_flag, err, errlen);
    f->decoding = 0;
    return rc;
}

int fwd_can_pick(const fwd_ctx *f) { return f->b->ops->pick != NULL; }

int fwd_decode_pick(fwd_ctx *f, int32_t token, be_pick *pick, volatile sig_atomic_t *abort_flag, char *err,
                    size_t errlen)
{
    if (!fwd_can_pick(f)) {
        snprintf(err, errlen, "the %s backend cannot pick candidates", f->b->ops->name);
        return -1;
    }
    f->decoding = 1;
    int rc = eval_tokens(f, &token, 1, NULL, pick, NULL, NULL, NULL, NULL, abort_flag, err, errlen);
    f->decoding = 0;
    return rc;
}

int fwd_picked_logits(fwd_ctx *f, float *logits, char *err, size_t errlen)
{
    const model_hparams *hp = &f->m->hp;
    if (!f->row_valid) {
        snprintf(err, errlen, "no picked decode step's logits to read");
        return -1;
    }
    be_range r = { f->row_at, sizeof(float) * (size_t)hp->n_vocab };
    be_host_read(f->b, &r, 1);
    if (be_failed(f->b, f->dev_err, sizeof f->dev_err)) {
        snprintf(err, errlen, "%s", f->dev_err);
        return -1;
    }
    memcpy(logits, f->row_at, r.bytes);   /* the pick soft-capped the row in place */
    return 0;
}

fwd_ctx *fwd_fork(fwd_ctx *src, int n_batch, char *err, size_t errlen)
{
    fwd_opts o = { kv_n_ctx(src->kv), n_batch, kv_page_size(src->kv) };
    fwd_ctx *f = fwd_create(src->m, src->b, &o, err, errlen);
    if (!f) return NULL;
    kv_cache *kv = kv_fork(src->kv, err, errlen);
    if (!kv) {
        fwd_free(f);
        return NULL;
    }
    kv_free(f->kv);
    f->kv = kv;
    /* linked to its source, whose lists its own start as where it uses them (fork_lists) */
    const int L = src->m->hp.n_layer, H = src->m->hp.n_head_kv;
    if (src->n_forks == src->cap_forks) {
        int nc = src->cap_forks ? src->cap_forks * 2 : 8;
        fwd_ctx **nf = realloc(src->forks, sizeof *nf * (size_t)nc);
        if (!nf) return f;   /* out of memory: its lists are built whole */
        src->forks = nf;
        src->cap_forks = nc;
    }
    if (!(f->fork_np = malloc(sizeof *f->fork_np * (size_t)L * (size_t)H))) return f;
    for (int il = 0; il < L; il++)
        for (int h = 0; h < H; h++) f->fork_np[il * H + h] = kv_n_pages(kv, il, h);
    src->forks[src->n_forks++] = f;
    f->origin = src;
    return f;
}

/* The batch's sequences checked against lead: each over its model and backend, distinct, not lead,
 * with room and valid ids. 0, or -1 with a message. */
static int check_batch(const fwd_ctx *lead, fwd_ctx *const *seqs, int n, const int32_t *ids, const be_pick *picks,
                       char *err, size_t errlen)
{
    if (n < 1 || n > FWD_BATCH_MAX || n > lead->n_batch) {
        snprintf(err, errlen, "a batch of %d sequences: 1 to %d (and at most the chunk size, %d)", n, FWD_BATCH_MAX,
                 lead->n_batch);
        return -1;
    }
    if (picks && !fwd_can_pick(lead)) {
        snprintf(err, errlen, "the %s backend cannot pick candidates", lead->b->ops->name);
        return -1;
    }
    for (int s = 0; s < n; s++) {
        const fwd_ctx *f = seqs[s];
        if (f == lead || f->m != lead->m || f->b != lead->b) {
            snprintf(err, errlen, "a batch's sequences run beside its lead, over its model and backend");
            return -1;
        }
        for (int t = 0; t < s; t++)
            if (seqs[t] == f) {
                snprintf(err, errlen, "a sequence twice in one batch");
                return -1;
            }
        if (check_ids(f, ids + s, 1, err, errlen)) return -1;
    }
    return 0;
}

int fwd_decode_batch(fwd_ctx *lead, fwd_ctx *const *seqs, int n, const int32_t *ids, float *const *logits,
                     be_pick *picks, volatile sig_atomic_t *abort_flag, char *err, size_t errlen)
{
    const model_hparams *hp = &lead->m->hp;
    size_t nv = (size_t)hp->n_vocab;
    if (check_batch(lead, seqs, n, ids, picks, err, errlen)) return -1;
    if (picks && !lead->batch_rows) {   /* the picked rows stay with the backend, bound */
        float *rows = alloc_f(lead, FWD_BATCH_MAX * nv);
        if (!rows || bind_f(lead, rows, FWD_BATCH_MAX * nv, 1, err, errlen)) {
            if (rows) free_f(lead, rows, FWD_BATCH_MAX * nv);
            else snprintf(err, errlen, "out of memory allocating a batch's logits");
            return -1;
        }
        lead->batch_rows = rows;
    }
    /* every sequence's policy starts the device work its begin reads (CHESS's scores) before any
     * begin waits for it: one wait for the batch */
    double prep_ms[FWD_BATCH_MAX] = { 0 };
    for (int s = 0; s < n; s++)
        if (seqs[s]->pol) {
            double t0 = now_ms();
            pol_set_prepare(seqs[s]->pol, kv_len(seqs[s]->kv));
            prep_ms[s] = now_ms() - t0;
        }
    /* nothing of the sequences' is pending: an eval takes its rows in before it returns (and a
     * lead's own, forward_rows takes) */
    for (int s = 0; s < n; s++) {
        seqs[s]->decoding = 1;
        seqs[s]->last_chunk = 1;
        seqs[s]->pol_err[0] = 0;
        seqs[s]->row_at = NULL;
        begin_eval(seqs[s], ids + s, 1);
        seqs[s]->st_sel_ms += prep_ms[s];
    }
    int rc = abort_flag && *abort_flag ? -1 : forward_rows(lead, seqs, n, ids, n, 0, NULL, 0, 0, abort_flag);
    if (!rc && output_rows(lead, 0, n, picks, lead->batch_rows)) rc = -4;
    if (!rc && lead->pend.at >= 0) rc = take_pending(lead, hp->n_layer);   /* the rows, with the output's wait */
    if (rc) {
        const char *pol_err = "a policy failed";
        for (int s = 0; s < n; s++)
            if (seqs[s]->pol_err[0]) pol_err = seqs[s]->pol_err;
        failure_message(lead, rc, pol_err, err, errlen);
        lead->pend.at = -1;
        for (int s = 0; s < n; s++) {
            fwd_ctx *f = seqs[s];
            f->n_dsel = 0;
            f->decoding = 0;
            kv_rewind(f->kv, f->eval_start);
        }
        return -1;
    }
    for (int s = 0; s < n; s++) {
        fwd_ctx *f = seqs[s];
        if (picks) {
            f->row_valid = 1;
            f->row_at = lead->batch_rows + (size_t)s * nv;
        } else {
            memcpy(logits[s], lead->logits + (size_t)s * nv, sizeof(float) * nv);
        }
        kv_commit(f->kv, f->eval_start + 1);
        record_step(f);
        f->decoding = 0;
    }
    return 0;
}
