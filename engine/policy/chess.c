/* chess.c - CHESS: hierarchical page selection, rebuilt at every decode step (the paper's main
 * text; rebuild=page or rebuild=event for fewer) and on an uncertainty event (quality-aware
 * backtracking).
 *
 * A page's summary is its mean key, flattened over the global layers and KV heads; a chunk
 * (chunk= pages) and a grid (grid= chunks) get the mean of their children's summaries. A
 * reconstruction builds the anchor (the mean key of the last `anchor` tokens, or with anchor=0 the
 * mean summary of the recent-window pages), scores every grid, chunk and page with one
 * matrix-vector product (raw dot products, or of unit rows: cosine similarity), keeps the top rho_g
 * grids, the top rho_c of the chunks inside them and the top rho_p of the pages inside those (or,
 * with a budget, as many of those pages as the budget allows), and every global layer attends to
 *   sink pages + selected pages + every page from the recent window onwards
 * by page index, without copying. Selection only: every page stays in memory.
 *
 * The paper scores with the raw dot product (score=dot); on the default model that ranks pages by
 * how strongly they carry the component all keys share (large near the start of the context), not
 * by what they say, and missed every pass key (docs/policies.md), so rows are scaled to unit length
 * by default (the anchor's norm does not change the ranking, so it stays as it is). The rows and
 * the anchor are computed by the backend where the keys are (be_ops.key_means: on a GPU from its
 * copies of the pages, into the bound rows the scores read there). */
#include "engine/policy/policy.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/quant.h"
#include "engine/page_list.h"
#include "engine/policy/pol_util.h"
#include "engine/policy/trace.h"

enum { P_PRESET, P_RHO_G, P_RHO_C, P_RHO_P, P_BUDGET, P_SINK, P_WINDOW, P_ANCHOR, P_CHUNK, P_GRID, P_REBUILD, P_SCORE, P_COUNT };

/* The presets, the only place they are written: the parser applies them (to the rho_* the spec
 * leaves at 0), and --help and the TUI's policy picker list them. */
static const pol_choice presets[] = {
    { "conservative", "rho_g=0.9,rho_c=0.9,rho_p=0.9" },
    { "moderate", "rho_g=0.8,rho_c=0.7,rho_p=0.7" },
    { "aggressive", "rho_g=0.5,rho_c=0.2,rho_p=0.1" },
    { NULL, NULL },
};
static const pol_choice scores[] = { { "cos", NULL }, { "dot", NULL }, { NULL, NULL } };
enum { REBUILD_STEP, REBUILD_PAGE, REBUILD_EVENT };
static const pol_choice rebuild_modes[] = { { "step", NULL }, { "page", NULL }, { "event", NULL }, { NULL, NULL } };

static const pol_param params[] = {
    [P_PRESET] = { "preset", POL_ENUM, 1, 0, 0, presets, "rho_g, rho_c and rho_p together:" },
    [P_RHO_G] = { "rho_g", POL_FLOAT, 0, 0, 1, NULL, "fraction of grids kept (0: from the preset)" },
    [P_RHO_C] = { "rho_c", POL_FLOAT, 0, 0, 1, NULL, "fraction of chunks kept inside kept grids (0: preset)" },
    [P_RHO_P] = { "rho_p", POL_FLOAT, 0, 0, 1, NULL, "fraction of pages kept inside kept chunks (0: preset)" },
    [P_BUDGET] = { "budget", POL_FLOAT, 0, 0, 1e9, NULL, "tokens attended (fraction or count); sets the page count at the last level" },
    [P_SINK] = { "sink", POL_INT, 1, 0, 1 << 20, NULL, "sink pages at the start, always kept" },
    [P_WINDOW] = { "window", POL_INT, 2, 1, 1 << 20, NULL, "recent-window pages, always kept" },
    [P_ANCHOR] = { "anchor", POL_INT, 16, 0, 1 << 20, NULL, "the anchor is the mean key of the last N tokens (0: of the window pages)" },
    [P_CHUNK] = { "chunk", POL_INT, 4, 1, 1 << 16, NULL, "pages per chunk" },
    [P_GRID] = { "grid", POL_INT, 4, 1, 1 << 16, NULL, "chunks per grid" },
    [P_REBUILD] = { "rebuild", POL_ENUM, REBUILD_STEP, 0, 0, rebuild_modes, "reconstruct at every decode step, at each new page, or only on uncertainty events:" },
    [P_SCORE] = { "score", POL_ENUM, 0, 0, 0, scores, "similarity to the anchor: cosine, or the paper's raw dot product" },
};
_Static_assert(POL_COUNT(params) == P_COUNT && P_COUNT <= POL_MAX_PARAMS, "chess: one entry per parameter");

/* Page i's part from one (global layer, KV head) when its summary row was computed: the page's
 * content generation and token count (kv_page.gen, n), which change whenever its keys do. */
typedef struct page_sig {
    uint64_t gen;
    int32_t n;
} page_sig;

/* A matrix the backend scores, kept between reconstructions and bound to the backend (be_bind: a
 * device backend keeps a twin and receives only the rows the host rewrote). */
typedef struct bound_mat {
    float *p;
    int cap;        /* rows */
    int bound;      /* be_bind succeeded (else ops read the host copy) */
    size_t width;   /* floats a row */
} bound_mat;

/* What rebuild_issue leaves rebuild_choose: the pages, window and candidates [first, last), the
 * chunks, grids and scored rows. */
typedef struct chess_pend {
    int np, nw, first, last, nc, ng, rows;
} chess_pend;

enum { PREP_NOTHING, PREP_ISSUED, PREP_FAILED };

typedef struct st_chess {
    double rho_g, rho_c, rho_p, budget;
    int sink, window, anchor, chunk, grid, rebuild, cosine;
    int64_t cur;
    int valid;                 /* a selection exists */
    int dirty;                 /* rebuild at the next step */
    int64_t built_at;          /* position of the last reconstruction */
    int64_t hold_until;        /* an event's selection stands until this position (its page regenerated) */
    int tail_from;             /* pages >= this index are attended (window at build time onwards) */
    int *sel;                  /* selected candidate pages, ascending */
    int n_sel, n_cand;
    int64_t rebuilds, events;
    int64_t n_pages_at_build;
    /* The summaries kept between reconstructions, so that one recomputes only the rows whose pages
     * changed (at a decode step, none, or the page that just left the window): page i's scored row
     * (its mean key; a unit row with score=cos) at pages.p + i * dim, valid while sig says so;
     * chunk c's scored row (the mean of its pages' mean keys) over c_n[c] pages (0: not computed);
     * grid g's over g_n[g] chunks. The backend computes them where the keys are (be_key_means:
     * a device backend from its copies of the pages, into the bound rows, with nothing sent). */
    be_backend *b;
    size_t dim;                /* n_global * n_head_kv * head_dim */
    int units;                 /* n_global * n_head_kv */
    bound_mat pages, chunks, grids, anchor_row, score;
    page_sig *sig;             /* [sig_cap][n_global * n_head_kv]; n = -1: not computed */
    int *c_n, *g_n;            /* [c_n_cap], [g_n_cap] */
    int sig_cap, c_n_cap, g_n_cap;   /* each grown on its own: one may fail */
    uint64_t *shape;           /* [n_global] each global layer's kv_layer_shape at the last check */
    int checked;               /* pages below checked - 1 unchanged while the shapes are */
    page_list *lists;          /* [n_global] every page of each global layer, for key_means */
    be_page_list *blists;      /* [n_global] the same as the op reads them */
    int n_lists;
    uint64_t name;             /* the lists' share of the backend's list names */
    /* a batch's step prepared (c_prepare) and not yet begun: at prep_pos (-1: none), what it did */
    int64_t prep_pos;
    int prep;
    chess_pend pend;           /* a reconstruction issued, its choice to make (rebuild_choose) */
    /* scratch */
    float *raw;                /* [dim] a page's mean key (anchor=0) */
    int *idx, *idx2;
    int idx_cap;
} st_chess;

static int c_create(void **out, const pol_env *env, const double *vals, char *err, size_t errlen)
{
    st_chess *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    s->rho_g = vals[P_RHO_G];   /* the preset's, unless the spec set its own */
    s->rho_c = vals[P_RHO_C];
    s->rho_p = vals[P_RHO_P];
    s->budget = vals[P_BUDGET];
    s->sink = (int)vals[P_SINK];
    s->window = (int)vals[P_WINDOW];
    s->chunk = (int)vals[P_CHUNK];
    s->grid = (int)vals[P_GRID];
    s->anchor = (int)vals[P_ANCHOR];
    s->rebuild = (int)vals[P_REBUILD];
    s->prep_pos = -1;
    s->cosine = vals[P_SCORE] == 0;
    s->dirty = 1;
    s->b = env->b;
    s->name = kv_next_gen();
    *out = s;
    return 0;
}

static void bm_free(st_chess *s, bound_mat *m)
{
    if (m->bound) be_unbind(s->b, m->p);
    free(m->p);
    *m = (bound_mat){ 0 };
}

/* The summaries forgotten: every row is recomputed at the next reconstruction. */
static void forget_summaries(st_chess *s)
{
    if (s->sig)
        for (size_t i = 0; i < (size_t)s->sig_cap * (size_t)s->units; i++) s->sig[i].n = -1;
    if (s->c_n) memset(s->c_n, 0, sizeof(int) * (size_t)s->c_n_cap);
    if (s->g_n) memset(s->g_n, 0, sizeof(int) * (size_t)s->g_n_cap);
    s->checked = 0;
}

static void c_destroy(void *st)
{
    st_chess *s = st;
    bm_free(s, &s->pages);
    bm_free(s, &s->chunks);
    bm_free(s, &s->grids);
    bm_free(s, &s->anchor_row);
    bm_free(s, &s->score);
    free(s->sig);
    free(s->c_n);
    free(s->g_n);
    for (int i = 0; s->lists && i < s->n_lists; i++) page_list_free(&s->lists[i]);
    free(s->lists);
    free(s->blists);
    free(s->shape);
    free(s->raw);
    free(s->sel);
    free(s->idx);
    free(s->idx2);
    free(s);
}

static int c_check(void *st, const pol_env *env, int64_t ctx, char *err, size_t errlen)
{
    st_chess *s = st;
    if (s->budget <= 0) return 0;
    int64_t b = pol_budget_tokens(s->budget, ctx);
    int P = kv_page_size(env->kv);
    int64_t fixed = (int64_t)(s->sink + s->window) * P;
    if (b < fixed) {
        snprintf(err, errlen, "chess: budget %lld tokens is below the %d sink + %d window pages it always keeps "
                 "(%lld tokens)", (long long)b, s->sink, s->window, (long long)fixed);
        return -1;
    }
    return 0;
}

/* Pages present in every global layer and KV head (prefill policies may leave tables of different
 * lengths). */
static int common_pages(const pol_env *env)
{
    int np = -1;
    for (int i = 0; i < env->n_global; i++) {
        for (int h = 0; h < env->n_head_kv; h++) {
            int n = kv_n_pages(env->kv, env->global[i], h);
            if (np < 0 || n < np) np = n;
        }
    }
    return np < 0 ? 0 : np;
}

/* Row r of the summary matrix: the mean key of page i, over all global layers and KV heads. */
static void page_row(const pol_env *env, int i, float *row)
{
    int64_t D = kv_head_dim(env->kv);
    float *o = row;
    for (int gl = 0; gl < env->n_global; gl++) {
        for (int h = 0; h < env->n_head_kv; h++, o += D) {
            const kv_page *p = kv_layer_page(env->kv, env->global[gl], h, i);
            float inv = p->n > 0 ? 1.0f / (float)p->n : 0.0f;
            for (int64_t d = 0; d < D; d++) o[d] = p->ksum[d] * inv;
        }
    }
}

static int ceil_frac(double rho, int n)
{
    int k = (int)ceil(rho * (double)n - 1e-9);
    if (k < 1 && n > 0) k = 1;
    return k > n ? n : k;
}

/* The trace of one level: n units of `per` candidate pages each (1 for pages), scores sc, kept
 * flags; positions from the first global layer's pages. */
static void trace_level(const st_chess *s, const pol_env *env, const char *what, int n, int per, const float *sc,
                        const unsigned char *kept)
{
    int64_t *first = malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1)), *last = malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
    if (first && last) {
        for (int u = 0; u < n; u++) {
            int p0 = s->sink + u * per, p1 = s->sink + (u + 1) * per - 1;
            if (p1 > s->sink + s->n_cand - 1) p1 = s->sink + s->n_cand - 1;
            const kv_page *a = kv_layer_page(env->kv, env->global[0], 0, p0), *b = kv_layer_page(env->kv, env->global[0], 0, p1);
            first[u] = a->n ? a->pos[0] : 0;
            last[u] = b->n ? b->pos[b->n - 1] : first[u];
        }
        pol_trace_units(env->trace, what, -1, -1, n, sc, kept, first, last);
    }
    free(first);
    free(last);
}

/* m grown to hold rows rows of width floats and bound again: 1 when it grew (its content is gone:
 * the rows are computed again, where a device backend held the only current copy), 0 when it had
 * room, -1 when out of host memory. A bind that fails leaves it unbound: the ops read the host
 * copy. It grows to twice what is asked, but not past `most` (the rows the whole context needs)
 * unless asked to. */
static int bm_reserve(st_chess *s, bound_mat *m, int rows, size_t width, int most)
{
    m->width = width;
    if (rows <= m->cap) return 0;
    int cap = 2 * rows;
    if (cap > most) cap = most;
    if (cap < rows) cap = rows;
    if (m->bound) be_unbind(s->b, m->p);
    m->bound = 0;
    free(m->p);
    m->cap = 0;
    m->p = malloc(sizeof(float) * (size_t)cap * width);
    if (!m->p) return -1;
    pol_huge_pages(m->p, sizeof(float) * (size_t)cap * width);
    m->cap = cap;
    char err[256];
    /* blank: its rows are the ops' (key_means, scores) but for an anchor=0 anchor, written whole */
    m->bound = be_bind_blank(s->b, m->p, sizeof(float) * (size_t)cap * width, 0, err, sizeof err) == 0;
    return 1;
}

/* Rows [r0, r1) of m are about to be written by the host. */
static float *bm_write(st_chess *s, bound_mat *m, int r0, int r1)
{
    float *p = m->p + (size_t)r0 * m->width;
    if (r1 > r0 && m->bound) be_host_write(s->b, p, sizeof(float) * (size_t)(r1 - r0) * m->width);
    return p;
}

/* A count array grown to want entries, the new ones 0 (not computed); 0, or -1 when out of memory
 * (the array and *cap as they were). */
static int grow_counts(int **a, int *cap, int want)
{
    if (want <= *cap) return 0;
    int *n = realloc(*a, sizeof(int) * (size_t)want);
    if (!n) return -1;
    memset(n + *cap, 0, sizeof(int) * (size_t)(want - *cap));
    *a = n;
    *cap = want;
    return 0;
}

/* The lists the backend reads the keys from (every page of each global layer) brought up to date,
 * as m's lists. 0, or -1 when out of host memory. */
static int update_lists(st_chess *s, const pol_env *env, be_key_means *m)
{
    if (!s->lists) {
        page_list *l = calloc((size_t)env->n_global, sizeof *l);
        be_page_list *bl = calloc((size_t)env->n_global, sizeof *bl);
        if (!l || !bl) {
            free(l);
            free(bl);
            return -1;
        }
        s->lists = l;
        s->blists = bl;
        s->n_lists = env->n_global;
    }
    for (int gl = 0; gl < env->n_global; gl++) {
        page_list *L = &s->lists[gl];
        /* a fork's list starts as its source's (on a device too: from_table), where that names
         * only pages from before the fork: its first step rewrites each head's last entries */
        uint64_t from = 0;
        const page_list *src =
            L->at.shape == 0 && env->fork_source ? env->fork_source(env, env->global[gl], &from) : NULL;
        if (!src || page_list_copy(L, src)) from = 0;
        if (page_list_update(L, env->kv, env->global[gl])) return -1;
        /* the top bit keeps the names apart from the forward pass's (engine/forward.c) */
        s->blists[gl] = (be_page_list){ L->refs, L->at.off, (1ull << 63) | (s->name << 20) | (uint64_t)(gl + 1),
                                        L->at.shape, from };
    }
    *m = (be_key_means){ .lists = s->blists, .n_lists = env->n_global, .n_head_kv = env->n_head_kv,
                         .head_dim = (int)kv_head_dim(env->kv), .chunk = s->chunk, .grid = s->grid, .unit = s->cosine };
    return 0;
}

/* Widen [*lo, *hi) to hold i. */
static void widen(int64_t *lo, int64_t *hi, int64_t i)
{
    if (*hi <= *lo) {
        *lo = i;
        *hi = i + 1;
        return;
    }
    if (i < *lo) *lo = i;
    if (i + 1 > *hi) *hi = i + 1;
}

/* The kept summaries grown to np pages (nc chunks, ng grids) and the rows of the candidates
 * [first, last) that are out of date named in m (the span from the first to the last of each
 * kind: rows between them are computed again, to the same floats): a page row where some (layer,
 * head) page changed, a chunk where one of its pages did or its page count differs, a grid
 * likewise. 0, or -1 when out of host memory. */
static int update_summaries(st_chess *s, const pol_env *env, int np, int first, int last, int nc, int ng,
                            be_key_means *m)
{
    if (s->dim == 0) {
        int units = env->n_global * env->n_head_kv;
        size_t dim = (size_t)units * (size_t)kv_head_dim(env->kv);
        free(s->shape);
        free(s->raw);
        s->shape = calloc((size_t)env->n_global, sizeof(uint64_t));
        s->raw = malloc(sizeof(float) * dim);
        if (!s->shape || !s->raw) return -1;
        s->units = units;
        s->dim = dim;
    }
    int64_t most_p = kv_n_ctx(env->kv) / kv_page_size(env->kv) + 2;   /* pages the context can fill */
    int most_c = (int)((most_p + s->chunk - 1) / s->chunk), most_g = (most_c + s->grid - 1) / s->grid;
    int gp = bm_reserve(s, &s->pages, np, s->dim, (int)most_p), gc = bm_reserve(s, &s->chunks, nc, s->dim, most_c);
    int gg = bm_reserve(s, &s->grids, ng, s->dim, most_g);
    if (gp < 0 || gc < 0 || gg < 0 || bm_reserve(s, &s->anchor_row, 1, s->dim, 1) < 0 ||
        bm_reserve(s, &s->score, last - first + nc + ng, 1, (int)most_p + most_c + most_g) < 0)
        return -1;
    if (s->pages.cap > s->sig_cap) {
        page_sig *g = realloc(s->sig, sizeof(page_sig) * (size_t)s->pages.cap * (size_t)s->units);
        if (!g) return -1;
        for (size_t i = (size_t)s->sig_cap * (size_t)s->units; i < (size_t)s->pages.cap * (size_t)s->units; i++) g[i].n = -1;
        s->sig = g;
        s->sig_cap = s->pages.cap;
    }
    if (grow_counts(&s->c_n, &s->c_n_cap, s->chunks.cap) || grow_counts(&s->g_n, &s->g_n_cap, s->grids.cap))
        return -1;
    if (gp || gc || gg) forget_summaries(s);   /* a grown matrix holds no rows */
    /* While no global layer's shape changed, only each table's last page (and those after it) can
     * have: the pages checked before, but the last, need no look. */
    int same = 1, least = np;
    for (int gl = 0; gl < env->n_global; gl++) {
        uint64_t sh = kv_layer_shape(env->kv, env->global[gl]);
        if (sh != s->shape[gl]) same = 0;
        s->shape[gl] = sh;
        for (int h = 0; h < env->n_head_kv; h++) {
            int n = kv_n_pages(env->kv, env->global[gl], h);
            if (n < least) least = n;
        }
    }
    int from = same && s->checked > 0 ? s->checked - 1 : 0;
    if (from < first) from = first;
    int n_cand = last - first;
    for (int c = 0; c < nc; c++) {
        int p0 = c * s->chunk, p1 = p0 + s->chunk < n_cand ? p0 + s->chunk : n_cand;
        int stale = s->c_n[c] != p1 - p0;
        for (int p = p0 > from - first ? p0 : from - first; p < p1; p++) {
            int i = first + p;
            page_sig *g = s->sig + (size_t)i * (size_t)s->units;
            int changed = 0;
            for (int gl = 0, u = 0; gl < env->n_global; gl++)
                for (int h = 0; h < env->n_head_kv; h++, u++) {
                    const kv_page *pg = kv_layer_page(env->kv, env->global[gl], h, i);
                    if (g[u].gen != pg->gen || g[u].n != pg->n) changed = 1;
                    g[u] = (page_sig){ pg->gen, pg->n };
                }
            if (!changed) continue;
            widen(&m->p0, &m->p1, i);
            stale = 1;
        }
        if (!stale) continue;
        widen(&m->c0, &m->c1, c);
        s->c_n[c] = p1 - p0;
        s->g_n[c / s->grid] = -1;   /* its grid is recomputed */
    }
    s->checked = least < last ? least : last;
    for (int g = 0; g < ng; g++) {
        int c0 = g * s->grid, c1 = c0 + s->grid < nc ? c0 + s->grid : nc;
        if (s->g_n[g] == c1 - c0) continue;
        widen(&m->g0, &m->g1, g);
        s->g_n[g] = c1 - c0;
    }
    m->first = first;
    m->n_cand = n_cand;
    m->page_rows = s->pages.p;
    m->chunk_rows = s->chunks.p;
    m->grid_rows = s->grids.p;
    return 0;
}

/* The reconstruction, in two halves: rebuild_issue brings the summary rows up to date and has the
 * backend score them (with prefetch, their download started without a wait: a batch issues every
 * sequence's before any reads them), rebuild_choose reads the scores and chooses s->sel among the
 * candidate pages [sink, np - window). rebuild_issue: 0 (scores issued: choose next), 1 (no
 * candidates: the selection is made, empty), -1 (out of memory). */
static int rebuild_issue(st_chess *s, const pol_env *env, int prefetch)
{
    int np = common_pages(env);
    int nw = s->window < np ? s->window : np;
    int first = s->sink, last = np - nw;   /* candidates [first, last) */
    s->valid = 1;
    s->dirty = 0;
    s->built_at = s->cur;
    s->rebuilds++;
    s->n_pages_at_build = np;
    s->tail_from = last > first ? last : first;
    s->n_sel = 0;
    s->n_cand = last > first ? last - first : 0;
    if (s->n_cand == 0 || env->n_global == 0) return 1;
    int nc = (s->n_cand + s->chunk - 1) / s->chunk;
    int ng = (nc + s->grid - 1) / s->grid;
    int rows = s->n_cand + nc + ng;
    int need_idx = rows > np ? rows : np;
    if (need_idx > s->idx_cap) {
        int *a = realloc(s->idx, sizeof(int) * (size_t)need_idx);
        if (a) s->idx = a;
        int *b = realloc(s->idx2, sizeof(int) * (size_t)need_idx);
        if (b) s->idx2 = b;
        int *c = realloc(s->sel, sizeof(int) * (size_t)need_idx);
        if (c) s->sel = c;
        if (!a || !b || !c) return -1;
        s->idx_cap = need_idx;
    }
    be_key_means m;
    if (update_lists(s, env, &m) != 0 || update_summaries(s, env, np, first, last, nc, ng, &m) != 0) {
        forget_summaries(s);   /* a half-done update leaves rows it did not record */
        return -1;
    }
    size_t dim = s->dim;
    float *anchor = s->anchor_row.p;
    if (s->anchor > 0) {   /* by tokens it follows the generation step by step instead of jumping when a page
                            * fills; computed with the rows, where the keys are */
        m.n_last = s->anchor;
        m.anchor = anchor;
    } else {   /* the mean summary of the recent-window pages */
        bm_write(s, &s->anchor_row, 0, 1);
        memset(anchor, 0, sizeof(float) * dim);
        for (int i = last; i < np; i++) {
            page_row(env, i, s->raw);
            for (size_t d = 0; d < dim; d++) anchor[d] += s->raw[d];
        }
        for (size_t d = 0; d < dim; d++) anchor[d] /= (float)(np - last > 0 ? np - last : 1);
    }
    const be_ops *ops = env->b->ops;
    if (m.p1 > m.p0 || m.c1 > m.c0 || m.g1 > m.g0 || m.n_last > 0) ops->key_means(env->b, &m);
    /* every page, chunk and grid scored against the anchor, then read back once */
    float *score = s->score.p;
    ops->scores(env->b, s->pages.p + (size_t)first * dim, s->n_cand, (int64_t)dim, anchor, score);
    ops->scores(env->b, s->chunks.p, nc, (int64_t)dim, anchor, score + s->n_cand);
    ops->scores(env->b, s->grids.p, ng, (int64_t)dim, anchor, score + s->n_cand + nc);
    if (prefetch) be_host_prefetch(env->b, &(be_range){ score, sizeof(float) * (size_t)rows }, 1);
    s->pend = (chess_pend){ np, nw, first, last, nc, ng, rows };
    return 0;
}

static void rebuild_choose(st_chess *s, const pol_env *env)
{
    const int np = s->pend.np, nw = s->pend.nw, first = s->pend.first, last = s->pend.last, nc = s->pend.nc,
              ng = s->pend.ng, rows = s->pend.rows;
    float *score = s->score.p;
    be_host_read(env->b, &(be_range){ score, sizeof(float) * (size_t)rows }, 1);
    const float *ps = score, *cs = score + s->n_cand, *gs = cs + nc;
    /* grids */
    for (int g = 0; g < ng; g++) s->idx[g] = g;
    int kg = pol_top_k(s->idx, ng, gs, ceil_frac(s->rho_g, ng));
    /* chunks inside the kept grids */
    int n2 = 0;
    for (int i = 0; i < kg; i++) {
        int g = s->idx[i];
        for (int c = g * s->grid; c < (g + 1) * s->grid && c < nc; c++) s->idx2[n2++] = c;
    }
    int kc = pol_top_k(s->idx2, n2, cs, ceil_frac(s->rho_c, n2));
    /* pages inside the kept chunks */
    int n3 = 0;
    for (int i = 0; i < kc; i++) {
        int c = s->idx2[i];
        for (int p = c * s->chunk; p < (c + 1) * s->chunk && p < s->n_cand; p++) s->idx[n3++] = p;
    }
    int kp = ceil_frac(s->rho_p, n3);
    if (s->budget > 0) {
        int P = kv_page_size(env->kv);
        int64_t btok = pol_budget_tokens(s->budget, s->cur + 1);
        int64_t room = (btok + P - 1) / P - s->sink - nw;
        kp = room < 0 ? 0 : room > n3 ? n3 : (int)room;
    }
    if (env->trace) {   /* which grids and chunks survived, before idx is reused for the pages */
        unsigned char *kept = calloc((size_t)(nc > 0 ? nc : 1), 1);
        if (kept) {
            for (int i = 0; i < n2; i++) kept[s->idx2[i] / s->grid] = 1;
            trace_level(s, env, s->cosine ? "chess grids (cosine to the anchor)" : "chess grids (dot with the anchor)", ng,
                        s->grid * s->chunk, gs, kept);
            memset(kept, 0, (size_t)nc);
            for (int i = 0; i < kc; i++) kept[s->idx2[i]] = 1;
            trace_level(s, env, "chess chunks", nc, s->chunk, cs, kept);
            free(kept);
        }
    }
    kp = pol_top_k(s->idx, n3, ps, kp);
    for (int i = 0; i < kp; i++) s->sel[i] = first + s->idx[i];
    s->n_sel = kp;
    if (env->trace) {   /* pages outside the kept chunks count as dropped */
        unsigned char *kept = calloc((size_t)s->n_cand, 1);
        if (kept) {
            for (int i = 0; i < kp; i++) kept[s->idx[i]] = 1;
            trace_level(s, env, "chess pages", s->n_cand, 1, ps, kept);
            if (s->anchor > 0)
                pol_trace_note(env->trace, "chess anchor: mean key of the last %d tokens (positions up to %lld)",
                               s->anchor, (long long)s->cur - 1);
            else
                pol_trace_note(env->trace, "chess anchor: pages %d..%d (positions %d..%lld)", last, np - 1,
                               kv_layer_page(env->kv, env->global[0], 0, last)->pos[0], (long long)s->cur - 1);
            free(kept);
        }
    }
}

/* Both halves at once: 0, or -1 when out of memory. */
static int rebuild(st_chess *s, const pol_env *env)
{
    int rc = rebuild_issue(s, env, 0);
    if (rc == 0) rebuild_choose(s, env);
    return rc < 0 ? -1 : 0;
}

/* A decode step at pos: 1 when it reconstructs the selection (the state brought to the step). */
static int step_due(st_chess *s, const pol_env *env, int64_t pos)
{
    s->cur = pos;
    if (pos < s->built_at) {   /* rewound past the reconstruction */
        s->dirty = 1;
        s->hold_until = 0;
    }
    int P = kv_page_size(env->kv);
    int due = s->rebuild == REBUILD_STEP ? pos != s->built_at : s->rebuild == REBUILD_PAGE ? pos / P != s->built_at / P : 0;
    if (due && pos >= s->hold_until) s->dirty = 1;
    return !s->valid || s->dirty;
}

/* A batch's step: the scores issued now, read by c_begin after every sequence's were. */
static void c_prepare(void *st, const pol_env *env, int64_t pos)
{
    st_chess *s = st;
    s->prep_pos = pos;
    s->prep = PREP_NOTHING;
    if (!step_due(s, env, pos)) return;
    int rc = rebuild_issue(s, env, 1);
    s->prep = rc < 0 ? PREP_FAILED : rc == 0 ? PREP_ISSUED : PREP_NOTHING;
}

static void c_begin(void *st, const pol_env *env, const int32_t *tokens, int64_t n, int64_t pos, int decoding)
{
    st_chess *s = st;
    if (!decoding) return;
    if (s->prep_pos == pos) {   /* prepared: the choice from the scores issued then */
        s->prep_pos = -1;
        if (s->prep == PREP_ISSUED) rebuild_choose(s, env);
        if (s->prep == PREP_FAILED) s->valid = 0;   /* out of memory: attend to everything this step */
        return;
    }
    if (step_due(s, env, pos) && rebuild(s, env) != 0) s->valid = 0;   /* out of memory: everything this step */
}

static int c_select(void *st, const pol_env *env, int il, const float *q, pol_sel *sel)
{
    (void)q;
    st_chess *s = st;
    if (!s->valid) return 0;
    int np = kv_n_pages(env->kv, il, 0);
    for (int h = 1; h < env->n_head_kv; h++)
        if (kv_n_pages(env->kv, il, h) > np) np = kv_n_pages(env->kv, il, h);
    pol_sel_head(sel, 0);
    int sk = s->sink < np ? s->sink : np;
    for (int i = 0; i < sk; i++) pol_sel_add(sel, i, NULL);
    for (int i = 0; i < s->n_sel; i++)
        if (s->sel[i] >= sk && s->sel[i] < s->tail_from && s->sel[i] < np) pol_sel_add(sel, s->sel[i], NULL);
    int from = s->tail_from > sk ? s->tail_from : sk;
    for (int i = from; i < np; i++) pol_sel_add(sel, i, NULL);
    return 1;
}

/* Uncertainty event: rebuild now, while the uncertain page's keys are in the cache (they move the
 * anchor), and keep the result for the regeneration that restarts at keep_from. */
static void c_reselect(void *st, const pol_env *env, int64_t pos, int64_t keep_from, pol_change *chg)
{
    st_chess *s = st;
    int n_old = s->valid ? s->n_sel : 0;
    int *old = malloc(sizeof(int) * (size_t)(n_old > 0 ? n_old : 1));
    if (!old) return;   /* out of memory: the old selection stays */
    memcpy(old, s->sel, sizeof(int) * (size_t)n_old);
    s->cur = pos;
    s->prep_pos = -1;
    if (rebuild(s, env) != 0) {
        s->valid = 0;
        free(old);
        return;
    }
    s->events++;
    s->built_at = keep_from;
    s->hold_until = pos;   /* per-step rebuilds resume once the page is generated again */
    /* both lists ascending: a merge gives the pages that entered and left */
    int i = 0, j = 0;
    while (i < n_old || j < s->n_sel) {
        if (j >= s->n_sel || (i < n_old && old[i] < s->sel[j])) {
            if (chg->n_removed < POL_CHANGE_MAX) chg->removed[chg->n_removed] = old[i];
            chg->n_removed++;
            i++;
        } else if (i >= n_old || s->sel[j] < old[i]) {
            if (chg->n_added < POL_CHANGE_MAX) chg->added[chg->n_added] = s->sel[j];
            chg->n_added++;
            j++;
        } else {
            i++;
            j++;
        }
    }
    free(old);
}

static void c_save(void *st, bytes_w *w)
{
    st_chess *s = st;
    bw_i64(w, s->cur);
    bw_u32(w, (uint32_t)s->valid);
    bw_u32(w, (uint32_t)s->dirty);
    bw_i64(w, s->built_at);
    bw_u32(w, (uint32_t)s->tail_from);
    bw_u32(w, (uint32_t)s->n_cand);
    bw_i64(w, s->rebuilds);
    bw_i64(w, s->events);
    bw_i64(w, s->n_pages_at_build);
    bw_u32(w, (uint32_t)(s->valid ? s->n_sel : 0));
    if (s->valid) bw_put(w, s->sel, sizeof(int) * (size_t)s->n_sel);
}

static int c_load(void *st, const pol_env *env, bytes_r *r)
{
    st_chess *s = st;
    int64_t cur = br_i64(r);
    int valid = (int)br_u32(r), dirty = (int)br_u32(r);
    int64_t built_at = br_i64(r);
    int tail_from = (int)br_u32(r), n_cand = (int)br_u32(r);
    int64_t rebuilds = br_i64(r), events = br_i64(r), npb = br_i64(r);
    uint32_t n_sel = br_u32(r);
    /* every field in the range this sequence can produce: pages and positions of its context */
    int64_t ctx = kv_n_ctx(env->kv), max_pages = ctx / kv_page_size(env->kv) + 1;
    if (r->err || n_sel > max_pages || cur < 0 || cur > ctx || (valid != 0 && valid != 1) || (dirty != 0 && dirty != 1) ||
        built_at < 0 || built_at > ctx || tail_from < 0 || tail_from > max_pages || n_cand < 0 || n_cand > max_pages ||
        rebuilds < 0 || events < 0 || events > rebuilds || npb < 0 || npb > max_pages)
        return -1;
    int *sel = malloc(sizeof(int) * (n_sel ? n_sel : 1));
    if (!sel || br_get(r, sel, sizeof(int) * n_sel)) {
        free(sel);
        return -1;
    }
    for (uint32_t i = 0; i < n_sel; i++)
        if (sel[i] < 0 || sel[i] >= max_pages || (i > 0 && sel[i] <= sel[i - 1])) {
            free(sel);
            return -1;
        }
    free(s->sel);
    s->sel = sel;
    s->n_sel = (int)n_sel;
    s->idx_cap = 0;   /* sel is exactly n_sel long now: the next rebuild grows it with the scratch */
    s->cur = cur;
    s->valid = valid;
    s->dirty = dirty;
    s->built_at = built_at;
    s->prep_pos = -1;
    s->tail_from = tail_from;
    s->n_cand = n_cand;
    s->rebuilds = rebuilds;
    s->events = events;
    s->n_pages_at_build = npb;
    forget_summaries(s);
    return 0;
}

static void c_describe(void *st, char *buf, size_t len)
{
    st_chess *s = st;
    if (s->rebuilds == 0) {   /* after a prefill, before the first decode step: nothing chosen yet */
        snprintf(buf, len, "chess: no selection yet (the first decode step makes one), %d sink + window", s->sink);
        return;
    }
    snprintf(buf, len, "chess: %d of %d candidate pages + %d sink + window, %lld rebuilds (%lld on events)", s->n_sel,
             s->n_cand, s->sink, (long long)s->rebuilds, (long long)s->events);
}

const pol_ops pol_chess = {
    .name = "chess",
    .summary = "CHESS: hierarchical grid/chunk/page selection from an anchor, rebuilt on demand",
    .stage = POL_STAGE_DECODE,
    .params = params,
    .n_params = P_COUNT,
    .create = c_create,
    .destroy = c_destroy,
    .begin = c_begin,
    .prepare = c_prepare,
    .select = c_select,
    .reselect = c_reselect,
    .check = c_check,
    .describe = c_describe,
    .save = c_save,
    .load = c_load,
};
