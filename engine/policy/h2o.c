/* h2o.c - H2O (heavy-hitter oracle): every token accumulates the attention it receives, from every
 * prompt query and then from every generated token's query; the cache keeps the recent tokens and
 * the heavy hitters (highest accumulated attention), and evicts the rest, freeing their pages.
 * Per global layer and KV head (the query heads sharing a KV head add their attention). The prompt
 * is evicted down to the budget at its end; while decoding, each step that takes a head over the
 * budget evicts its lowest-scoring tokens outside the recent window. Saves memory. */
#include "engine/policy/policy.h"

#include <math.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/policy/pol_util.h"
#include "engine/policy/trace.h"

enum { P_BUDGET, P_RECENT, P_COUNT };

static const pol_param params[] = {
    [P_BUDGET] = { "budget", POL_FLOAT, 0.2, 0, 1e9, NULL, "tokens kept per layer and KV head (fraction or count)" },
    [P_RECENT] = { "recent", POL_FLOAT, 0.5, 0, 1, NULL, "share of the budget for the most recent tokens (the rest: heavy hitters)" },
};
_Static_assert(POL_COUNT(params) == P_COUNT && P_COUNT <= POL_MAX_PARAMS, "h2o: one entry per parameter");

typedef struct st_h2o {
    double budget, recent;
    int n_layer, n_head_kv;
    float **score;           /* [layer * n_head_kv + g]: accumulated attention by position */
    int64_t *cap;
    int64_t budget_tokens;   /* fixed at the end of the prompt */
    int64_t evicted, kept_last;
} st_h2o;

static int h_create(void **out, const pol_env *env, const double *vals, char *err, size_t errlen)
{
    st_h2o *s = calloc(1, sizeof *s);
    if (!s) goto oom;
    s->budget = vals[P_BUDGET];
    s->recent = vals[P_RECENT];
    s->n_layer = kv_n_layer(env->kv);
    s->n_head_kv = env->n_head_kv;
    s->score = calloc((size_t)(s->n_layer * s->n_head_kv), sizeof *s->score);
    s->cap = calloc((size_t)(s->n_layer * s->n_head_kv), sizeof *s->cap);
    if (!s->score || !s->cap) goto oom;
    *out = s;
    return 0;
oom:
    if (s) {
        free(s->score);
        free(s->cap);
        free(s);
    }
    snprintf(err, errlen, "out of memory");
    return -1;
}

static void h_destroy(void *st)
{
    st_h2o *s = st;
    for (int i = 0; i < s->n_layer * s->n_head_kv; i++) free(s->score[i]);
    free(s->score);
    free(s->cap);
    free(s);
}

static int h_check(void *st, const pol_env *env, int64_t ctx, char *err, size_t errlen)
{
    (void)env;
    st_h2o *s = st;
    int64_t b = pol_budget_tokens(s->budget, ctx);
    if (b < 2) {
        snprintf(err, errlen, "h2o: budget %lld tokens leaves no room for recent tokens and heavy hitters", (long long)b);
        return -1;
    }
    return 0;
}

/* Make the score array of (il, g) cover positions < n. */
static float *scores_for(st_h2o *s, int il, int g, int64_t n)
{
    int k = il * s->n_head_kv + g;
    if (n > s->cap[k]) {
        int64_t nc = n * 2 > 1024 ? n * 2 : 1024;
        float *ns = realloc(s->score[k], sizeof(float) * (size_t)nc);
        if (!ns) return NULL;
        memset(ns + s->cap[k], 0, sizeof(float) * (size_t)(nc - s->cap[k]));
        s->score[k] = ns;
        s->cap[k] = nc;
    }
    return s->score[k];
}

/* Evict head g of layer il down to the budget: the recent share by position, the rest by score. */
static int evict(st_h2o *s, const pol_env *env, int il, int g, const float *sc, char *err, size_t errlen)
{
    int64_t T = pol_head_positions(env, il, g, NULL);
    int64_t B = s->budget_tokens;
    if (T <= B) return 0;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)T);
    float *heavy = malloc(sizeof(float) * (size_t)T);
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)T), *keep = malloc(sizeof(int64_t) * (size_t)T);
    int rc = -1;
    if (!pos || !heavy || !idx || !keep) goto out;
    pol_head_positions(env, il, g, pos);
    int64_t n_recent = (int64_t)(s->recent * (double)B);
    if (n_recent < 1) n_recent = 1;
    if (n_recent > B) n_recent = B;
    int64_t cut = T - n_recent;   /* table order is position order: the last n_recent are recent */
    for (int64_t j = 0; j < cut; j++) heavy[j] = sc[pos[j]];
    int64_t k = pol_top_k64(heavy, cut, B - n_recent, idx);
    int64_t nk = 0;
    for (int64_t i = 0; i < k; i++) keep[nk++] = idx[i];
    for (int64_t j = cut; j < T; j++) keep[nk++] = j;
    if (env->trace) {   /* the recent tokens show as kept with an infinite score */
        unsigned char *kept = calloc((size_t)T, 1);
        if (kept) {
            for (int64_t i = 0; i < nk; i++) kept[keep[i]] = 1;
            for (int64_t j = cut; j < T; j++) heavy[j] = INFINITY;
            pol_trace_tokens(env->trace, "h2o accumulated attention", il, g, T, heavy, kept, pos);
            free(kept);
        }
    }
    if (kv_keep_tokens_on(env->kv, env->b, il, g, keep, nk) != 0) goto out;
    s->evicted += T - nk;
    s->kept_last = nk;
    rc = 0;
out:
    if (rc) snprintf(err, errlen, "h2o: out of memory evicting");
    free(pos);
    free(heavy);
    free(idx);
    free(keep);
    return rc;
}

static int h_layer_done(void *st, const pol_env *env, int il, const pol_chunk *c, char *err, size_t errlen)
{
    const float *q = c->q;
    int64_t n = c->n, p0 = c->p0;
    int last = c->last, decoding = c->decoding;
    st_h2o *s = st;
    int64_t row = (int64_t)env->n_head * env->head_dim;
    if (!decoding && last) s->budget_tokens = pol_budget_tokens(s->budget, p0 + n);
    /* every KV head's mass in one call, then head by head its scores and eviction */
    int64_t *tok0;
    float *mass;
    int32_t *pos = NULL;
    if (pol_layer_mass(env, il, q, n, row, p0, &mass, &tok0) ||
        !(pos = malloc(sizeof(int32_t) * (size_t)(tok0[env->n_head_kv] > 0 ? tok0[env->n_head_kv] : 1)))) {
        free(tok0);
        free(mass);
        snprintf(err, errlen, "h2o: out of memory");
        return -1;
    }
    int rc = 0;
    for (int g = 0; g < env->n_head_kv && !rc; g++) {
        float *sc = scores_for(s, il, g, p0 + n);
        if (!sc) {
            snprintf(err, errlen, "h2o: out of memory");
            rc = -1;
            break;
        }
        int64_t T = pol_head_positions(env, il, g, pos);
        for (int64_t j = 0; j < T; j++) sc[pos[j]] += mass[tok0[g] + j];
        if ((last || decoding) && s->budget_tokens > 0 && evict(s, env, il, g, sc, err, errlen)) rc = -1;
    }
    free(tok0);
    free(mass);
    free(pos);
    return rc;
}

static void h_save(void *st, bytes_w *w)
{
    st_h2o *s = st;
    bw_i64(w, s->budget_tokens);
    bw_i64(w, s->evicted);
    bw_i64(w, s->kept_last);
    bw_u32(w, (uint32_t)(s->n_layer * s->n_head_kv));
    for (int k = 0; k < s->n_layer * s->n_head_kv; k++) {
        bw_i64(w, s->cap[k]);
        bw_put(w, s->score[k], sizeof(float) * (size_t)s->cap[k]);
    }
}

static int h_load(void *st, const pol_env *env, bytes_r *r)
{
    st_h2o *s = st;
    int64_t bt = br_i64(r), ev = br_i64(r), kl = br_i64(r);
    uint32_t n = br_u32(r);
    int64_t ctx = kv_n_ctx(env->kv);
    if (r->err || (int)n != s->n_layer * s->n_head_kv || bt < 0 || bt > ctx || ev < 0 || kl < 0 || kl > ctx) return -1;
    for (uint32_t k = 0; k < n; k++) {
        int64_t cap = br_i64(r);
        if (r->err || cap < 0 || cap > 4 * kv_n_ctx(env->kv) + 1024) return -1;
        const void *p = br_view(r, sizeof(float) * (size_t)cap);
        if (!p) return -1;
        float *sc = malloc(sizeof(float) * (size_t)(cap > 0 ? cap : 1));
        if (!sc) return -1;
        memcpy(sc, p, sizeof(float) * (size_t)cap);
        for (int64_t i = 0; i < cap; i++)
            if (!isfinite(sc[i]) || sc[i] < 0) {   /* accumulated attention: finite, never negative */
                free(sc);
                return -1;
            }
        free(s->score[k]);
        s->score[k] = sc;
        s->cap[k] = cap;
    }
    s->budget_tokens = bt;
    s->evicted = ev;
    s->kept_last = kl;
    return 0;
}

static void h_describe(void *st, char *buf, size_t len)
{
    st_h2o *s = st;
    snprintf(buf, len, "h2o: budget %lld tokens per head (%.0f%% recent), %lld evicted", (long long)s->budget_tokens,
             s->recent * 100, (long long)s->evicted);
}

const pol_ops pol_h2o = {
    .name = "h2o",
    .summary = "H2O: keep recent tokens and heavy hitters by accumulated attention",
    .stage = POL_STAGE_PREFILL,
    .prefill_only = 0,        /* it evicts while decoding too */
    .params = params,
    .n_params = P_COUNT,
    .create = h_create,
    .destroy = h_destroy,
    .layer_done = h_layer_done,
    .check = h_check,
    .describe = h_describe,
    .save = h_save,
    .load = h_load,
};
