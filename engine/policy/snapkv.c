/* snapkv.c - SnapKV: at the end of the prompt, the last `window` prompt tokens (the observation
 * window, which holds the question) vote for the earlier tokens they attend to. Per global layer and
 * KV head: the softmax attention of the window's queries (summed over the window and over the query
 * heads sharing the KV head), pooled along the sequence (max or mean over `kernel` neighbours, so a
 * chosen token keeps its context), the top budget - window earlier tokens are kept together with the
 * window itself, and every other token is evicted: its pages are freed. Decoding then appends as
 * usual. Saves memory; the prefill itself runs on the whole prompt. */
#include "engine/policy/policy.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/policy/pol_util.h"
#include "engine/policy/trace.h"

enum { P_WINDOW, P_KERNEL, P_POOL, P_BUDGET, P_COUNT };

static const pol_choice pools[] = { { "max", NULL }, { "avg", NULL }, { NULL, NULL } };

static const pol_param params[] = {
    [P_WINDOW] = { "window", POL_INT, 32, 1, 4096, NULL, "observation window: the last prompt tokens whose attention votes" },
    [P_KERNEL] = { "kernel", POL_INT, 7, 1, 255, NULL, "pooling kernel (tokens) over the votes" },
    [P_POOL] = { "pool", POL_ENUM, 0, 0, 0, pools, "pooling of the votes" },
    [P_BUDGET] = { "budget", POL_FLOAT, 1024, 0, 1e9, NULL, "tokens kept per layer and KV head, window included (fraction or count)" },
};
_Static_assert(POL_COUNT(params) == P_COUNT && P_COUNT <= POL_MAX_PARAMS, "snapkv: one entry per parameter");

typedef struct st_snap {
    int window, kernel, avg;
    double budget;
    int n_head_q;            /* query heads x head_dim per row */
    int64_t row;             /* floats per query row */
    float **ring;            /* per layer: [window][row] last query rows, ring order */
    int64_t *ring_n;         /* per layer: rows ever pushed in this eval */
    int n_layer_max;
    int64_t kept_last, seen_last, evictions;
} st_snap;

static int sn_create(void **out, const pol_env *env, const double *vals, char *err, size_t errlen)
{
    st_snap *s = calloc(1, sizeof *s);
    if (!s) goto oom;
    s->window = (int)vals[P_WINDOW];
    s->kernel = (int)vals[P_KERNEL];
    s->avg = vals[P_POOL] == 1;
    s->budget = vals[P_BUDGET];
    if (s->budget >= 1 && (int64_t)s->budget <= s->window) {
        snprintf(err, errlen, "snapkv: budget %g tokens does not exceed the %d-token observation window", s->budget,
                 s->window);
        free(s);
        return -1;
    }
    s->row = (int64_t)env->n_head * env->head_dim;
    s->n_layer_max = kv_n_layer(env->kv);
    s->ring = calloc((size_t)s->n_layer_max, sizeof *s->ring);
    s->ring_n = calloc((size_t)s->n_layer_max, sizeof *s->ring_n);
    if (!s->ring || !s->ring_n) goto oom;
    for (int i = 0; i < env->n_global; i++) {
        s->ring[env->global[i]] = malloc(sizeof(float) * (size_t)(s->window * s->row));
        if (!s->ring[env->global[i]]) goto oom;
    }
    *out = s;
    return 0;
oom:
    if (s) {
        for (int i = 0; s->ring && i < s->n_layer_max; i++) free(s->ring[i]);
        free(s->ring);
        free(s->ring_n);
        free(s);
    }
    snprintf(err, errlen, "out of memory");
    return -1;
}

static void sn_destroy(void *st)
{
    st_snap *s = st;
    for (int i = 0; i < s->n_layer_max; i++) free(s->ring[i]);
    free(s->ring);
    free(s->ring_n);
    free(s);
}

static int sn_check(void *st, const pol_env *env, int64_t ctx, char *err, size_t errlen)
{
    (void)env;
    st_snap *s = st;
    int64_t b = pol_budget_tokens(s->budget, ctx);
    if (b <= s->window) {
        snprintf(err, errlen, "snapkv: budget %lld tokens does not exceed the %d-token observation window",
                 (long long)b, s->window);
        return -1;
    }
    return 0;
}

/* Keep the window, and the budget - window best earlier tokens by pooled votes (the window's
 * attention mass on head g's T tokens), for head g. */
static int compress_head(st_snap *s, const pol_env *env, int il, int g, const float *votes, int64_t T, int64_t qpos0,
                         int64_t budget, char *err, size_t errlen)
{
    if (T <= budget) return 0;
    float *pooled = malloc(sizeof(float) * (size_t)T);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)T);
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)T), *keep = malloc(sizeof(int64_t) * (size_t)T);
    int rc = -1;
    err[0] = 0;
    if (!pooled || !pos || !idx || !keep) goto out;
    pol_head_positions(env, il, g, pos);
    /* prefix: the tokens before the observation window, in table order */
    int64_t prefix = 0;
    while (prefix < T && pos[prefix] < qpos0) prefix++;
    pol_pool(votes, prefix, s->kernel, s->avg, pooled);
    int64_t room = budget - (T - prefix);
    int64_t k = pol_top_k64(pooled, prefix, room > 0 ? room : 0, idx);
    if (env->trace) {
        unsigned char *kept = calloc((size_t)(prefix > 0 ? prefix : 1), 1);
        if (kept) {
            for (int64_t i = 0; i < k; i++) kept[idx[i]] = 1;
            pol_trace_tokens(env->trace, "snapkv pooled window votes", il, g, prefix, pooled, kept, pos);
            free(kept);
        }
    }
    int64_t nk = 0;
    for (int64_t i = 0; i < k; i++) keep[nk++] = idx[i];
    for (int64_t j = prefix; j < T; j++) keep[nk++] = j;
    if (kv_keep_tokens_on(env->kv, env->b, il, g, keep, nk) != 0) {
        snprintf(err, errlen, "snapkv: out of memory compressing the cache");
        goto out;
    }
    s->kept_last = nk;
    s->seen_last = T;
    rc = 0;
out:
    if (rc && !err[0]) snprintf(err, errlen, "snapkv: out of memory");
    free(pooled);
    free(pos);
    free(idx);
    free(keep);
    return rc;
}

static int sn_layer_done(void *st, const pol_env *env, int il, const pol_chunk *c, char *err, size_t errlen)
{
    const float *q = c->q;
    int64_t n = c->n, p0 = c->p0;
    int last = c->last, decoding = c->decoding;
    st_snap *s = st;
    if (decoding || !s->ring[il]) return 0;
    /* keep the last `window` query rows of this eval: the chunk's last `window` at most (an
     * earlier row's slot is a later row's; sn_query_rows asks for no more) */
    for (int64_t t = n > s->window ? n - s->window : 0; t < n; t++) {
        int64_t slot = (s->ring_n[il] + t) % s->window;
        memcpy(s->ring[il] + slot * s->row, q + t * s->row, sizeof(float) * (size_t)s->row);
    }
    s->ring_n[il] += n;
    if (!last) return 0;
    int64_t pushed = s->ring_n[il];
    int64_t nw = pushed < s->window ? pushed : s->window;
    s->ring_n[il] = 0;   /* the next eval (a new chat turn) collects its own window */
    /* unroll the ring: rows pushed-nw .. pushed-1 are the prompt's last nw positions, in order */
    float *wq = malloc(sizeof(float) * (size_t)(nw * s->row));
    if (!wq) {
        snprintf(err, errlen, "snapkv: out of memory");
        return -1;
    }
    for (int64_t r = 0; r < nw; r++)
        memcpy(wq + r * s->row, s->ring[il] + ((pushed - nw + r) % s->window) * s->row, sizeof(float) * (size_t)s->row);
    int64_t end = p0 + n;
    int64_t budget = pol_budget_tokens(s->budget, end);
    /* every KV head's votes in one call, where some head holds more than the budget */
    int over = 0;
    for (int g = 0; g < env->n_head_kv; g++) over += kv_head_tokens(env->kv, il, g) > budget;
    int64_t *tok0 = NULL;
    float *votes = NULL;
    if (over && pol_layer_mass(env, il, wq, nw, s->row, end - nw, &votes, &tok0)) {
        free(wq);
        snprintf(err, errlen, "snapkv: out of memory");
        return -1;
    }
    int rc = 0;
    for (int g = 0; g < env->n_head_kv && rc == 0 && over; g++)
        rc = compress_head(s, env, il, g, votes + tok0[g], tok0[g + 1] - tok0[g], end - nw, budget, err, errlen);
    if (rc == 0) s->evictions++;
    free(tok0);
    free(votes);
    free(wq);
    return rc;
}

/* The chunk's last `window` query rows (the observation window is the prompt's last rows). */
static void sn_query_rows(void *st, const pol_chunk *c, int64_t *r0, int64_t *r1)
{
    const st_snap *s = st;
    *r0 = *r1 = 0;
    if (c->decoding) return;
    *r0 = c->n > s->window ? c->n - s->window : 0;
    *r1 = c->n;
}

static void sn_describe(void *st, char *buf, size_t len)
{
    st_snap *s = st;
    snprintf(buf, len, "snapkv: window %d, kept %lld of %lld tokens per head at the last prompt", s->window,
             (long long)s->kept_last, (long long)s->seen_last);
}

const pol_ops pol_snapkv = {
    .name = "snapkv",
    .summary = "SnapKV: the observation window's pooled attention keeps the top tokens per head",
    .stage = POL_STAGE_PREFILL,
    .prefill_only = 1,
    .params = params,
    .n_params = P_COUNT,
    .create = sn_create,
    .destroy = sn_destroy,
    .layer_done = sn_layer_done,
    .query_rows = sn_query_rows,
    .check = sn_check,
    .describe = sn_describe,
};
