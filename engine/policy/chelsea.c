/* chelsea.c - Chelsea: KV clustering by chunked soft matching.
 *
 * When a global layer's KV head holds more than budget + gap tokens (after any prefill chunk, which
 * is gap tokens long, or decode step), it is compressed back to the budget: the first `sinks` and last `recent` tokens
 * are kept aside; the rest is cut into chunks of `chunk` tokens; inside a chunk, alternate tokens
 * form sets A and B and every A token is linked to its most cosine-similar B key; over all chunks the
 * most similar links are kept, as many as tokens must go, and each linked A token is merged into its
 * B partner: keys and values become the centroid weighted by degree n_t (the number of original
 * tokens a token stands for), and the degree adds. One pass removes at most half of the middle, so
 * passes repeat until the budget is met. Attention then adds log(n_t) to a merged token's logit (the
 * cache's log-degree, applied by the attention kernel), so a centroid weighs as much as the tokens it
 * replaced. Saves memory. A few outlier heads (`outliers`, 4%) keep their full cache: those whose
 * keys are least similar along the sequence (chelsea_head_similarity, measured by kvchat calibrate
 * and handed in through pol_env.head_sim); without a calibration every head merges. The model's
 * first layer, when it is a global layer, keeps its full cache too (the paper's App. C). */
#include "engine/policy/policy.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/policy/chelsea.h"
#include "engine/policy/pol_util.h"
#include "engine/policy/trace.h"
#include "common/quant.h"

/* f32 rows (keys, values, positions, degrees) of the heads one merge call takes at most: a 7B
 * model's 8 KV heads of a 32K prompt (270 MiB) in one, which a device merges side by side. */
#define CHELSEA_GROUP_BYTES ((int64_t)1 << 30)

enum { P_BUDGET, P_GAP, P_SINKS, P_RECENT, P_CHUNK, P_OUTLIERS, P_FIRST, P_COUNT };

static const pol_param params[] = {
    [P_BUDGET] = { "budget", POL_FLOAT, 0.2, 0, 1e9, NULL, "tokens B per layer and KV head after compression (fraction of the prompt or count)" },
    [P_GAP] = { "gap", POL_INT, 64, 1, 1 << 20, NULL, "compress when a head holds more than budget + gap tokens" },
    [P_SINKS] = { "sinks", POL_INT, 16, 0, 1 << 20, NULL, "first tokens kept aside" },
    [P_RECENT] = { "recent", POL_INT, 64, 0, 1 << 20, NULL, "last tokens kept aside" },
    [P_CHUNK] = { "chunk", POL_INT, 256, 2, 1 << 20, NULL, "soft-matching chunk size c" },
    [P_OUTLIERS] = { "outliers", POL_FLOAT, 0.04, 0, 1, NULL, "share of global-layer KV heads kept whole (the least similar keys, by calibration)" },
    [P_FIRST] = { "first", POL_INT, 1, 0, 1, NULL, "keep the model's first layer whole when it is a global layer (the paper's App. C)" },
};
_Static_assert(POL_COUNT(params) == P_COUNT && P_COUNT <= POL_MAX_PARAMS, "chelsea: one entry per parameter");

/* The trace of one pass: every A token's best-link similarity (tokens without a link: -inf), what
 * stayed, and each merge that touches a traced position. */
static void trace_pass(pol_trace *t, int il, int g, int pass, const be_link *links, int64_t nl, int64_t r,
                       const char *gone, const int32_t *pos, int64_t T)
{
    float *sc = malloc(sizeof(float) * (size_t)T);
    unsigned char *kept = malloc((size_t)T);
    if (sc && kept) {
        for (int64_t j = 0; j < T; j++) {
            sc[j] = -INFINITY;
            kept[j] = !gone[j];
        }
        for (int64_t i = 0; i < nl; i++) sc[links[i].a] = links[i].sim;
        char what[96];
        snprintf(what, sizeof what, "chelsea pass %d (A tokens by link similarity; DROP = merged)", pass);
        pol_trace_tokens(t, what, il, g, T, sc, kept, pos);
        for (int64_t i = 0; i < r; i++)
            if (pol_trace_covers(t, pos[links[i].a], pos[links[i].a]) || pol_trace_covers(t, pos[links[i].b], pos[links[i].b]))
                pol_trace_note(t, "chelsea pass %d L%d h%d: position %d merged into %d (cosine %.4f)", pass, il, g,
                               pos[links[i].a], pos[links[i].b], (double)links[i].sim);
    }
    free(sc);
    free(kept);
}

/* One head's rows merged by be's merge_heads (the host's when be is NULL). */
static int64_t merge_one(be_backend *be, float *k, float *v, int32_t *pos, float *deg, int64_t T, int64_t D,
                         int64_t target, int64_t gap, int sinks, int recent, int chunk, int replay)
{
    be_merge_head h = { k, v, pos, deg, T };
    be_merge m = { .heads = &h, .n_heads = 1, .dim = D, .target = target, .gap = gap, .sinks = sinks,
                   .recent = recent, .chunk = chunk, .replay = replay };
    return be_merge_heads(be, &m) == 0 ? h.n : -1;
}

int64_t chelsea_merge(be_backend *be, float *k, float *v, int32_t *pos, float *deg, int64_t T, int64_t D, int64_t target,
                      int sinks, int recent, int chunk)
{
    return merge_one(be, k, v, pos, deg, T, D, target, 0, sinks, recent, chunk, 0);
}

int64_t chelsea_replay(be_backend *be, float *k, float *v, int32_t *pos, float *deg, int64_t T, int64_t D,
                       int64_t target, int64_t gap, int sinks, int recent, int chunk)
{
    return merge_one(be, k, v, pos, deg, T, D, target, gap, sinks, recent, chunk, 1);
}

/* Head g of layer il as f32 rows (k, v may be NULL), with positions and degrees when asked. */
static int64_t read_head(const kv_cache *kv, int il, int g, float **k, float **v, int32_t **pos, float **deg)
{
    int64_t T = 0, D = kv_head_dim(kv);
    int np = kv_n_pages(kv, il, g);
    for (int i = 0; i < np; i++) T += kv_layer_page(kv, il, g, i)->n;
    size_t rows = (size_t)(T > 0 ? T : 1);
    *k = malloc(sizeof(float) * rows * (size_t)D);
    if (v) *v = malloc(sizeof(float) * rows * (size_t)D);
    if (pos) *pos = malloc(sizeof(int32_t) * rows);
    if (deg) *deg = malloc(sizeof(float) * rows);
    if (!*k || (v && !*v) || (pos && !*pos) || (deg && !*deg)) return -1;
    int64_t j = 0;
    for (int i = 0; i < np; i++) {
        const kv_page *p = kv_layer_page(kv, il, g, i);
        for (int32_t t = 0; t < p->n; t++, j++) {
            for (int64_t d = 0; d < D; d++) {
                (*k)[j * D + d] = quant_fp16_to_f32(p->k[(size_t)t * (size_t)D + (size_t)d]);
                if (v) (*v)[j * D + d] = quant_fp16_to_f32(p->v[(size_t)t * (size_t)D + (size_t)d]);
            }
            if (pos) (*pos)[j] = p->pos[t];
            if (deg) (*deg)[j] = expf(p->logdeg[t]);
        }
    }
    return T;
}

int chelsea_head_similarity(be_backend *be, const kv_cache *kv, int il, int g, int chunk, double *out)
{
    float *k = NULL, *sim = NULL;
    int64_t *best = NULL;
    int64_t T = read_head(kv, il, g, &k, NULL, NULL, NULL), D = kv_head_dim(kv);
    int rc = -1;
    if (T < 2 || !(sim = malloc(sizeof(float) * (size_t)T)) || !(best = malloc(sizeof(int64_t) * (size_t)T))) goto out;
    be_links bl = { .k = k, .dim = D, .m0 = 0, .m1 = T, .chunk = chunk, .best = best, .sim = sim };
    be_soft_links(be, &bl);
    double sum = 0;
    int64_t n = 0;
    for (int64_t c0 = 0; c0 < T; c0 += chunk) {
        int64_t c1 = c0 + chunk < T ? c0 + chunk : T;
        for (int64_t a = c0; a < c1; a += 2)
            if (best[a] >= 0) {
                sum += sim[a];
                n++;
            }
    }
    if (n > 0) {
        *out = sum / (double)n;
        rc = 0;
    }
out:
    free(k);
    free(sim);
    free(best);
    return rc;
}

typedef struct st_chel {
    double budget;
    int gap, sinks, recent, chunk;
    int64_t budget_tokens;
    int64_t eval_end;        /* the running eval's end (begin): a fractional budget is of this prompt */
    int64_t merges, passes_last, kept_last;
    char *spared;            /* [n_layer * n_head_kv]: outlier heads that keep their full cache */
    int n_spared, n_heads, calibrated;
    int first_spared;        /* layer 0 is global and kept whole */
    int n_head_kv;
} st_chel;

typedef struct head_rank {
    float sim;
    int idx;
} head_rank;

static int by_sim_asc(const void *x, const void *y)
{
    const head_rank *p = x, *q = y;
    if (p->sim != q->sim) return p->sim < q->sim ? -1 : 1;
    return p->idx - q->idx;
}

static void ch_destroy(void *st)
{
    st_chel *s = st;
    if (!s) return;
    free(s->spared);
    free(s);
}

static int ch_create(void **out, const pol_env *env, const double *vals, char *err, size_t errlen)
{
    st_chel *s = calloc(1, sizeof *s);
    int nl = kv_n_layer(env->kv);
    head_rank *r = malloc(sizeof *r * (size_t)(env->n_global * env->n_head_kv + 1));
    if (!s || !r || !(s->spared = calloc((size_t)nl * (size_t)env->n_head_kv, 1))) {
        free(r);
        ch_destroy(s);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    s->budget = vals[P_BUDGET];
    s->gap = (int)vals[P_GAP];
    s->sinks = (int)vals[P_SINKS];
    s->recent = (int)vals[P_RECENT];
    s->chunk = (int)vals[P_CHUNK];
    s->n_head_kv = env->n_head_kv;
    s->n_heads = env->n_global * env->n_head_kv;
    /* outlier heads: the least similar share of the calibrated global-layer heads (rounded) */
    int n = 0;
    for (int i = 0; env->head_sim && i < env->n_global; i++)
        for (int g = 0; g < env->n_head_kv; g++) {
            int idx = env->global[i] * env->n_head_kv + g;
            if (!isnan(env->head_sim[idx])) r[n++] = (head_rank){ env->head_sim[idx], idx };
        }
    s->calibrated = n > 0;
    qsort(r, (size_t)n, sizeof *r, by_sim_asc);
    int k = (int)floor(vals[P_OUTLIERS] * n + 0.5);
    for (int i = 0; i < k && i < n; i++) s->spared[r[i].idx] = 1;
    s->n_spared = k < n ? k : n;
    if (vals[P_FIRST] != 0 && env->n_global > 0 && env->global[0] == 0) {   /* Gemma's layer 0 is sliding-window */
        s->first_spared = 1;
        for (int g = 0; g < env->n_head_kv; g++) s->spared[g] = 1;
    }
    free(r);
    *out = s;
    return 0;
}

static int ch_check(void *st, const pol_env *env, int64_t ctx, char *err, size_t errlen)
{
    (void)env;
    st_chel *s = st;
    int64_t b = pol_budget_tokens(s->budget, ctx);
    if (b <= s->sinks + s->recent) {
        snprintf(err, errlen, "chelsea: budget %lld tokens is not above the %d sink + %d recent tokens kept aside",
                 (long long)b, s->sinks, s->recent);
        return -1;
    }
    return 0;
}

typedef struct pass_trace {
    const pol_env *env;
    int il;
    const int *g;
} pass_trace;

static void trace_merge_pass(void *ctx, int head, int pass, const be_link *links, int64_t nl, int64_t r,
                             const char *gone, const int32_t *pos, int64_t T)
{
    const pass_trace *t = ctx;
    trace_pass(t->env->trace, t->il, t->g[head], pass, links, nl, r, gone, pos, T);
}

/* Merge KV heads g[0 .. n) of layer il to the budget in one call of the backend's merge: at once
 * (decoding, past budget + gap), or with replay the whole prompt as the trigger would have taken it
 * (the prompt's end). */
static int compress_heads(st_chel *s, const pol_env *env, int il, const int *g, int n, int replay)
{
    be_merge_head *h = calloc((size_t)n, sizeof *h);
    int64_t *before = malloc(sizeof(int64_t) * (size_t)n), D = kv_head_dim(env->kv);
    float *ld = NULL;
    int rc = -1;
    if (!h || !before) goto out;
    for (int i = 0; i < n; i++)
        if ((h[i].n = before[i] = read_head(env->kv, il, g[i], &h[i].k, &h[i].v, &h[i].pos, &h[i].deg)) < 0) goto out;
    pass_trace pt = { env, il, g };
    be_merge m = { .heads = h, .n_heads = n, .dim = D, .target = s->budget_tokens, .gap = s->gap, .sinks = s->sinks,
                   .recent = s->recent, .chunk = s->chunk, .replay = replay,
                   .on_pass = env->trace ? trace_merge_pass : NULL, .ctx = &pt };
    if (be_merge_heads(env->b, &m) != 0) goto out;
    for (int i = 0; i < n; i++) {
        for (int64_t j = 0; j < h[i].n && env->trace; j++)
            if (pol_trace_covers(env->trace, h[i].pos[j], h[i].pos[j]))
                pol_trace_note(env->trace, "chelsea L%d h%d: position %d stands for %.0f tokens", il, g[i], h[i].pos[j],
                               (double)h[i].deg[j]);
        free(ld);
        if (!(ld = malloc(sizeof(float) * (size_t)(h[i].n > 0 ? h[i].n : 1)))) goto out;
        for (int64_t j = 0; j < h[i].n; j++) ld[j] = logf(h[i].deg[j]);
        if (kv_rebuild_head(env->kv, il, g[i], h[i].k, h[i].v, h[i].pos, ld, h[i].n) != 0) goto out;
        s->merges += before[i] - h[i].n;
        s->kept_last = h[i].n;
    }
    rc = 0;
out:
    for (int i = 0; h && i < n; i++) {
        free(h[i].k);
        free(h[i].v);
        free(h[i].pos);
        free(h[i].deg);
    }
    free(h);
    free(before);
    free(ld);
    return rc;
}

static void ch_begin(void *st, const pol_env *env, const int32_t *tokens, int64_t n, int64_t p0, int decoding)
{
    ((st_chel *)st)->eval_end = p0 + n;
}

/* The prompt is encoded whole, the question against every token of the document (merging during
 * the prefill, as kvchat did from issue 22 to 29, encoded the question against centroids); at its
 * last chunk each layer's heads are merged as the trigger would have merged them while the cache
 * grew, each time it passed B + g, so each compression merges the most similar of many links.
 * Compressing the whole prompt in one go (kvchat until issue 22) had to merge every A token whatever
 * its similarity (at 20% a pass removes at most half the middle, and three passes are needed), which
 * folded the pass key's digits into filler. While decoding the trigger acts as it comes. */
static int ch_layer_done(void *st, const pol_env *env, int il, const pol_chunk *c, char *err, size_t errlen)
{
    st_chel *s = st;
    if (!c->decoding) {
        if (!c->last) return 0;   /* the prompt is merged once it is all in, below */
        int64_t end = s->eval_end > c->p0 + c->n ? s->eval_end : c->p0 + c->n;
        s->budget_tokens = pol_budget_tokens(s->budget, end);
    }
    if (s->budget_tokens <= 0) return 0;
    /* the heads past the trigger, merged together (a device merges them side by side), as many at
     * a time as CHELSEA_GROUP_BYTES of f32 rows hold; one at a time when tracing, so that each
     * head's notes follow its passes */
    int g[BE_MERGE_MAX_HEADS], n = 0;
    int64_t bytes = 0, row = 2 * (int64_t)sizeof(float) * kv_head_dim(env->kv) + 8;
    for (int h = 0; h <= env->n_head_kv; h++) {
        int64_t T = 0;
        if (h < env->n_head_kv) {
            int np = kv_n_pages(env->kv, il, h);
            for (int i = 0; i < np; i++) T += kv_layer_page(env->kv, il, h, i)->n;
        }
        /* an outlier head keeps its full cache; the prompt ends at the budget, as every policy's
         * does; otherwise the trigger is B + g */
        int take = h < env->n_head_kv && !s->spared[il * env->n_head_kv + h] &&
                   T > s->budget_tokens + (c->last && !c->decoding ? 0 : s->gap);
        if (n > 0 && (h == env->n_head_kv || (take && (bytes + T * row > CHELSEA_GROUP_BYTES || n == BE_MERGE_MAX_HEADS || env->trace)))) {
            if (compress_heads(s, env, il, g, n, !c->decoding) != 0) {
                snprintf(err, errlen, "chelsea: out of memory merging");
                return -1;
            }
            n = 0, bytes = 0;
        }
        if (take) {
            g[n++] = h;
            bytes += T * row;
        }
    }
    return 0;
}

static void ch_save(void *st, bytes_w *w)
{
    st_chel *s = st;
    bw_i64(w, s->budget_tokens);
    bw_i64(w, s->merges);
    bw_i64(w, s->kept_last);
}

static int ch_load(void *st, const pol_env *env, bytes_r *r)
{
    st_chel *s = st;
    int64_t b = br_i64(r), m = br_i64(r), k = br_i64(r), ctx = kv_n_ctx(env->kv);
    if (r->err || b < 0 || b > ctx || m < 0 || k < 0 || k > ctx) return -1;
    s->budget_tokens = b;
    s->merges = m;
    s->kept_last = k;
    return 0;
}

static void ch_describe(void *st, char *buf, size_t len)
{
    st_chel *s = st;
    const char *first = s->first_spared ? ", layer 0 kept whole" : "";
    if (s->calibrated)
        snprintf(buf, len, "chelsea: budget %lld tokens per head, %lld tokens merged into centroids, %d of %d global "
                 "KV heads spared as outliers (calibrated)%s", (long long)s->budget_tokens, (long long)s->merges,
                 s->n_spared, s->n_heads, first);
    else
        snprintf(buf, len, "chelsea: budget %lld tokens per head, %lld tokens merged into centroids (no outlier heads: "
                 "the model is not calibrated, run kvchat calibrate)%s", (long long)s->budget_tokens,
                 (long long)s->merges, first);
}

const pol_ops pol_chelsea = {
    .name = "chelsea",
    .summary = "Chelsea: merge similar tokens into degree-weighted centroids (chunked soft matching)",
    .stage = POL_STAGE_PREFILL,
    .prefill_only = 0,        /* it merges while decoding too */
    .params = params,
    .n_params = P_COUNT,
    .create = ch_create,
    .destroy = ch_destroy,
    .begin = ch_begin,
    .layer_done = ch_layer_done,
    .query_rows = pol_no_query_rows,   /* it merges keys and values */
    .check = ch_check,
    .describe = ch_describe,
    .save = ch_save,
    .load = ch_load,
};
