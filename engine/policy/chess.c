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
 * by page index, without copying. Selection only: every page stays in memory. */
#include "engine/policy/policy.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/quant.h"
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
    /* scratch */
    float *mat, *anchor_rows, *score;
    size_t mat_cap;
    int *idx, *idx2;
    int idx_cap;
} st_chess;

static int c_create(void **out, const pol_env *env, const double *vals, char *err, size_t errlen)
{
    (void)env;
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
    s->cosine = vals[P_SCORE] == 0;
    s->dirty = 1;
    *out = s;
    return 0;
}

static void c_destroy(void *st)
{
    st_chess *s = st;
    free(s->sel);
    free(s->mat);
    free(s->anchor_rows);
    free(s->score);
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

static void mean_rows(const float *rows, int n, size_t dim, float *out)
{
    memset(out, 0, sizeof(float) * dim);
    for (int r = 0; r < n; r++)
        for (size_t d = 0; d < dim; d++) out[d] += rows[(size_t)r * dim + d];
    float inv = n > 0 ? 1.0f / (float)n : 0.0f;
    for (size_t d = 0; d < dim; d++) out[d] *= inv;
}

/* The mean key of the last n tokens each global layer and KV head holds (fewer where it holds
 * fewer), flattened as page_row flattens. The paper's anchor is built
 * from the recent window's keys; taken by tokens it follows the generation step by step instead of
 * jumping when a page fills. */
static void anchor_of_tokens(const pol_env *env, int n, float *out)
{
    int64_t D = kv_head_dim(env->kv);
    float *o = out;
    for (int gl = 0; gl < env->n_global; gl++) {
        for (int h = 0; h < env->n_head_kv; h++, o += D) {
            memset(o, 0, sizeof(float) * (size_t)D);
            int got = 0;
            for (int i = kv_n_pages(env->kv, env->global[gl], h) - 1; i >= 0 && got < n; i--) {
                const kv_page *p = kv_layer_page(env->kv, env->global[gl], h, i);
                for (int t = p->n - 1; t >= 0 && got < n; t--, got++) {
                    const uint16_t *k = p->k + (size_t)t * (size_t)D;
                    for (int64_t d = 0; d < D; d++) o[d] += quant_fp16_to_f32(k[d]);
                }
            }
            float inv = got > 0 ? 1.0f / (float)got : 0.0f;
            for (int64_t d = 0; d < D; d++) o[d] *= inv;
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

/* The reconstruction: choose s->sel among the candidate pages [sink, np - window). */
static int rebuild(st_chess *s, const pol_env *env)
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
    if (s->n_cand == 0 || env->n_global == 0) return 0;
    int nc = (s->n_cand + s->chunk - 1) / s->chunk;
    int ng = (nc + s->grid - 1) / s->grid;
    int rows = s->n_cand + nc + ng;
    size_t dim = (size_t)env->n_global * (size_t)env->n_head_kv * (size_t)kv_head_dim(env->kv);
    size_t need = (size_t)rows * dim;
    if (need > s->mat_cap) {
        float *m = realloc(s->mat, need * sizeof(float));
        if (!m) return -1;
        s->mat = m;
        s->mat_cap = need;
    }
    int need_idx = rows > np ? rows : np;
    if (need_idx > s->idx_cap) {
        int *a = realloc(s->idx, sizeof(int) * (size_t)need_idx);
        if (a) s->idx = a;
        int *b = realloc(s->idx2, sizeof(int) * (size_t)need_idx);
        if (b) s->idx2 = b;
        int *c = realloc(s->sel, sizeof(int) * (size_t)need_idx);
        if (c) s->sel = c;
        float *d = realloc(s->score, sizeof(float) * (size_t)need_idx);
        if (d) s->score = d;
        if (!a || !b || !c || !d) return -1;
        s->idx_cap = need_idx;
    }
    float *an = realloc(s->anchor_rows, sizeof(float) * dim * 2);   /* the anchor and a row of scratch */
    if (!an) return -1;
    s->anchor_rows = an;
    float *prow = s->mat, *crow = s->mat + (size_t)s->n_cand * dim, *grow_ = crow + (size_t)nc * dim;
    for (int i = 0; i < s->n_cand; i++) page_row(env, first + i, prow + (size_t)i * dim);
    for (int c = 0; c < nc; c++) {
        int p0 = c * s->chunk, p1 = p0 + s->chunk < s->n_cand ? p0 + s->chunk : s->n_cand;
        mean_rows(prow + (size_t)p0 * dim, p1 - p0, dim, crow + (size_t)c * dim);
    }
    for (int g = 0; g < ng; g++) {
        int c0 = g * s->grid, c1 = c0 + s->grid < nc ? c0 + s->grid : nc;
        mean_rows(crow + (size_t)c0 * dim, c1 - c0, dim, grow_ + (size_t)g * dim);
    }
    if (s->anchor > 0) {
        anchor_of_tokens(env, s->anchor, s->anchor_rows);
    } else {   /* the mean summary of the recent-window pages (the score buffer is free for a moment) */
        memset(s->anchor_rows, 0, sizeof(float) * dim);
        float *tmp = s->anchor_rows + dim;
        for (int i = last; i < np; i++) {
            page_row(env, i, tmp);
            for (size_t d = 0; d < dim; d++) s->anchor_rows[d] += tmp[d];
        }
        for (size_t d = 0; d < dim; d++) s->anchor_rows[d] /= (float)(np - last > 0 ? np - last : 1);
    }
    if (s->cosine) {
        /* cosine similarity: unit rows (the anchor's norm does not change the ranking). The paper
         * scores with the raw dot product (score=dot); on the default model that ranks pages by how
         * strongly they carry the component all keys share (large near the start of the context),
         * not by what they say, and missed every pass key (docs/policies.md). */
        for (int r = 0; r < rows; r++) {
            float *row = s->mat + (size_t)r * dim;
            double n2 = 0;
            for (size_t d = 0; d < dim; d++) n2 += (double)row[d] * row[d];
            float inv = n2 > 0 ? (float)(1.0 / sqrt(n2)) : 0.0f;
            for (size_t d = 0; d < dim; d++) row[d] *= inv;
        }
    }
    /* one product scores every page, chunk and grid */
    env->b->ops->scores(env->b, s->mat, rows, (int64_t)dim, s->anchor_rows, s->score);
    const float *ps = s->score, *cs = s->score + s->n_cand, *gs = cs + nc;
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
    return 0;
}

static void c_begin(void *st, const pol_env *env, const int32_t *tokens, int64_t n, int64_t pos, int decoding)
{
    st_chess *s = st;
    if (!decoding) return;
    s->cur = pos;
    if (pos < s->built_at) {   /* rewound past the reconstruction */
        s->dirty = 1;
        s->hold_until = 0;
    }
    int P = kv_page_size(env->kv);
    int due = s->rebuild == REBUILD_STEP ? pos != s->built_at : s->rebuild == REBUILD_PAGE ? pos / P != s->built_at / P : 0;
    if (due && pos >= s->hold_until) s->dirty = 1;
    if (!s->valid || s->dirty) {
        if (rebuild(s, env) != 0) s->valid = 0;   /* out of memory: attend to everything this step */
    }
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
    s->tail_from = tail_from;
    s->n_cand = n_cand;
    s->rebuilds = rebuilds;
    s->events = events;
    s->n_pages_at_build = npb;
    return 0;
}

static void c_describe(void *st, char *buf, size_t len)
{
    st_chess *s = st;
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
    .select = c_select,
    .reselect = c_reselect,
    .check = c_check,
    .describe = c_describe,
    .save = c_save,
    .load = c_load,
};
