/* quest.c - Quest: query-aware page selection. For every page and KV head, an upper bound of the
 * attention logit of the current query from the page's element-wise min/max keys,
 * sum_i max(q_i * min_i, q_i * max_i) (summed over the query heads sharing the KV head); each KV
 * head of each global layer attends to its budget/P best pages plus the page being written.
 * Selection only: every page stays in memory. */
#include "engine/policy/policy.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/logit_pick.h"
#include "engine/page_list.h"
#include "engine/policy/pol_util.h"
#include "engine/policy/trace.h"

enum { P_BUDGET, P_COUNT };

static const pol_param params[] = {
    [P_BUDGET] = { "budget", POL_FLOAT, 1024, 0, 1e9, NULL, "tokens attended per KV head (fraction or count), in whole pages" },
};
_Static_assert(POL_COUNT(params) == P_COUNT && P_COUNT <= POL_MAX_PARAMS, "quest: one entry per parameter");

typedef struct st_quest {
    double budget;
    int64_t cur;
    float *score;             /* every head's bounds, when they come back (a trace, or k past BE_PICK_MAX) */
    int *idx;
    /* [n_global] each global layer's summaries of every head's pages but its current one, for the
     * backend's bounds: kept from step to step, so a step looks at each head's last pages only */
    page_sums *lists;
    int64_t *from;            /* [n_head_kv] pages bounded a head: all but its current one */
    int32_t *best, *n_best;   /* [n_head_kv][BE_PICK_MAX], [n_head_kv] */
    int n_lists;
    int64_t cap;
    int64_t pages_last, pages_avail;
    uint64_t serial;          /* its lists' share of the backend's names (pol_bounds_table) */
} st_quest;

static int q_create(void **out, const pol_env *env, const double *vals, char *err, size_t errlen)
{
    (void)env;
    st_quest *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    s->budget = vals[P_BUDGET];
    s->serial = kv_next_gen();
    *out = s;
    return 0;
}

static void q_destroy(void *st)
{
    st_quest *s = st;
    free(s->score);
    free(s->idx);
    for (int i = 0; s->lists && i < s->n_lists; i++) page_sums_free(&s->lists[i]);
    free(s->lists);
    free(s->from);
    free(s->best);
    free(s->n_best);
    free(s);
}

static int q_check(void *st, const pol_env *env, int64_t ctx, char *err, size_t errlen)
{
    st_quest *s = st;
    int64_t b = pol_budget_tokens(s->budget, ctx);
    if (b < 2 * kv_page_size(env->kv)) {
        snprintf(err, errlen, "quest: budget %lld tokens is below two pages (%d tokens): the page being written "
                 "and one selected page", (long long)b, 2 * kv_page_size(env->kv));
        return -1;
    }
    return 0;
}

static void q_begin(void *st, const pol_env *env, const int32_t *tokens, int64_t n, int64_t p0, int decoding)
{
    if (decoding) ((st_quest *)st)->cur = p0;
}

/* The trace of one KV head's choice: every page but the current one, its bound and whether it is
 * among the n kept (idx[0..n), ascending). */
static void trace_pages(const st_quest *s, const pol_env *env, int il, int g, int np, int n, const float *score)
{
    int64_t *first = malloc(sizeof(int64_t) * (size_t)np), *last = malloc(sizeof(int64_t) * (size_t)np);
    unsigned char *kept = calloc((size_t)np, 1);
    if (first && last && kept) {
        for (int i = 0; i < n; i++) kept[s->idx[i]] = 1;
        for (int i = 0; i < np; i++) {
            const kv_page *p = kv_layer_page(env->kv, il, g, i);
            first[i] = p->n ? p->pos[0] : 0;
            last[i] = p->n ? p->pos[p->n - 1] : -1;   /* an emptied page covers nothing */
        }
        pol_trace_units(env->trace, "quest pages (bound of the query)", il, g, np, score, kept, first, last);
    }
    free(first);
    free(last);
    free(kept);
}

/* 1 when the page the step's token is in is the last of head g's table: the token is there, or
 * goes there when the cache takes its row after the last layer (kv_next_row_opens_page); 0 when its
 * row will open a page of its own (attention reads it after the list, always). */
static int cur_page_listed(const st_quest *s, const pol_env *env, int il, int g)
{
    int np = kv_n_pages(env->kv, il, g);
    if (np == 0) return 0;
    const kv_page *p = kv_layer_page(env->kv, il, g, np - 1);
    return (p->n > 0 && p->pos[p->n - 1] == s->cur) || !kv_next_row_opens_page(env->kv, il, g);
}

/* The per-layer lists and the step's arrays, made at the first use. -1: out of memory. */
static int make_lists(st_quest *s, const pol_env *env)
{
    if (s->lists) return 0;
    int Hkv = env->n_head_kv;
    s->lists = calloc((size_t)env->n_global, sizeof *s->lists);
    s->from = malloc(sizeof(int64_t) * (size_t)Hkv);
    s->best = malloc(sizeof(int32_t) * (size_t)Hkv * BE_PICK_MAX);
    s->n_best = malloc(sizeof(int32_t) * (size_t)Hkv);
    if (!s->lists || !s->from || !s->best || !s->n_best) {
        free(s->lists);
        free(s->from);
        free(s->best);
        free(s->n_best);
        s->lists = NULL, s->from = NULL, s->best = s->n_best = NULL;
        return -1;
    }
    s->n_lists = env->n_global;
    return 0;
}

/* The pages a head's bounds cover (from[g]: each head's pages but its current one, whether its
 * table lists it yet or not) and k, the pages a head attends with its current one. Returns the
 * most pages a head has, current one counted; *all: every head's fit in k (nothing to bound). */
static int heads_from(st_quest *s, const pol_env *env, int il, int *k, int *all, int64_t *total)
{
    int P = kv_page_size(env->kv), np_max = 0;
    *k = (int)((pol_budget_tokens(s->budget, s->cur + 1) + P - 1) / P);
    *all = 1;
    *total = 0;
    for (int g = 0; g < env->n_head_kv; g++) {
        s->from[g] = kv_n_pages(env->kv, il, g) - cur_page_listed(s, env, il, g);
        int np = (int)s->from[g] + 1;
        if (np > np_max) np_max = np;
        if (*k < np) *all = 0;
        *total += s->from[g];
    }
    return np_max;
}

/* After a restore: every global layer's summaries that a step would bound put on the device now,
 * so the first step after sends only what changed since (be_place_bounds). */
static void q_place(void *st, const pol_env *env)
{
    st_quest *s = st;
    if (make_lists(s, env)) return;
    for (int gl = 0; gl < env->n_global; gl++) {
        int il = env->global[gl], k, all;
        int64_t total;
        heads_from(s, env, il, &k, &all, &total);
        if (all || total <= 0) continue;   /* a step would bound nothing */
        page_sums *L = &s->lists[gl];
        if (page_sums_update(L, env->kv, il, s->from)) return;
        be_bounds r = { .n_head_kv = env->n_head_kv, .group = env->n_head / env->n_head_kv, .dim = env->head_dim,
                        .sum = L->sums, .off = L->at.off, .end = L->at.end, .table = pol_bounds_table(s->serial, il),
                        .shape = kv_layer_shape(env->kv, il) };
        be_place_bounds(env->b, &r);
    }
}

static int q_select(void *st, const pol_env *env, int il, const float *q, pol_sel *sel)
{
    st_quest *s = st;
    int Hkv = env->n_head_kv;
    int gl = 0;
    while (gl < env->n_global && env->global[gl] != il) gl++;
    if (gl == env->n_global) return 0;   /* a sliding-window layer: every page */
    if (make_lists(s, env)) return 0;
    int k, all;
    int64_t total;
    int np_max = heads_from(s, env, il, &k, &all, &total);
    s->pages_avail = np_max;
    if (all) {
        s->pages_last = np_max;
        return 0;
    }
    /* every head's pages but its current one: the bound of the head's G queries over each */
    page_sums *L = &s->lists[gl];
    if (page_sums_update(L, env->kv, il, s->from)) return 0;
    int64_t room = L->at.off[Hkv];   /* the bounds' (and the ids'): a region of at least its pages a head */
    if (room > s->cap) {
        int64_t cap = room * 2;
        float *ns = realloc(s->score, sizeof(float) * (size_t)cap);
        if (ns) s->score = ns;
        int *ni = realloc(s->idx, sizeof(int) * (size_t)cap);
        if (ni) s->idx = ni;
        if (!ns || !ni) return 0;
        s->cap = cap;
    }
    /* the backend picks each head's k - 1 best, unless the bounds must come back (a trace, or more
     * pages than a backend picks); where it can keep them for attention (a device backend), they
     * stay there: attention reads the chosen pages and then each head's current one, if listed */
    int on_host = env->trace || k - 1 > BE_PICK_MAX;
    int kept = !on_host && k - 1 > 0 && env->sel_buf;
    be_bounds r = { .q = q, .n_head_kv = Hkv, .group = env->n_head / Hkv, .dim = env->head_dim, .sum = L->sums,
                    .off = L->at.off, .end = L->at.end, .table = pol_bounds_table(s->serial, il),
                    .shape = kv_layer_shape(env->kv, il), .k = on_host ? 0 : k - 1, .best = s->best,
                    .n_best = s->n_best, .u = on_host ? s->score : NULL };
    if (kept) {
        r.best = env->sel_buf + (int64_t)il * Hkv * (BE_PICK_MAX + 1);   /* the layer's slot: best, counts */
        r.n_best = r.best + (int64_t)Hkv * BE_PICK_MAX;
    }
    if (k - 1 > 0 || on_host) env->b->ops->bound_pages(env->b, &r);
    if (kept) {
        sel->best = r.best;
        sel->n_best = r.n_best;
        sel->from = s->from;
        sel->k = r.k;
        s->pages_last = k < np_max ? k : np_max;
        return 1;
    }
    for (int g = 0; g < Hkv; g++) {
        int np = kv_n_pages(env->kv, il, g), nb = (int)s->from[g];
        pol_sel_head(sel, g);
        if (np == 0) continue;
        if (on_host) {
            /* the op's order: NaN and -inf bounds are never chosen */
            const float *sc = s->score + L->at.off[g];
            int m = 0;
            for (int i = 0; i < nb; i++)
                if (lp_value(sc[i]) > -INFINITY) s->idx[m++] = i;
            int n = pol_top_k(s->idx, m, sc, k - 1);
            if (env->trace) trace_pages(s, env, il, g, nb, n, s->score + L->at.off[g]);
            for (int i = 0; i < n; i++) pol_sel_add(sel, s->idx[i], NULL);
        } else if (k - 1 > 0) {
            for (int i = 0; i < s->n_best[g]; i++) pol_sel_add(sel, s->best[g * r.k + i], NULL);
        }
        if (nb < np) pol_sel_add(sel, np - 1, NULL);   /* the page the current token is in */
    }
    if (Hkv > 1) sel->per_head = 1;
    s->pages_last = k < np_max ? k : np_max;
    return 1;
}

static void q_describe(void *st, char *buf, size_t len)
{
    st_quest *s = st;
    snprintf(buf, len, "quest: %lld of %lld pages per KV head", (long long)s->pages_last, (long long)s->pages_avail);
}

const pol_ops pol_quest = {
    .name = "quest",
    .summary = "Quest: per-page upper bound from min/max keys, top pages per layer and KV head",
    .stage = POL_STAGE_DECODE,
    .params = params,
    .n_params = P_COUNT,
    .create = q_create,
    .destroy = q_destroy,
    .begin = q_begin,
    .select = q_select,
    .place = q_place,
    .check = q_check,
    .describe = q_describe,
};
