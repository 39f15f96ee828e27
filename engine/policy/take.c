/* take.c - TAKE: task-aware eviction during chunked prefill.
 *
 * The prompt is prefilled in chunks of Z tokens. The question's tokens (at most its last p; the
 * prompt's last p when no question is known: the probe) run with every chunk at their own
 * positions (the engine appends them as probe rows that leave no K/V behind), so after each chunk
 * every global layer knows what the question attends to in the cache so far. The probe's query is
 * smoothed across chunks (EMA, weight alpha on the new chunk); the cached tokens are scored by the
 * probe's softmax attention (summed over probe rows and the query heads sharing each KV head),
 * average-pooled along the sequence (eq. 11), and only the top k per layer and KV head survive
 * into the next chunk, so the KV memory of a layer never exceeds Z + k tokens (plus
 * the probe rows while a chunk runs). Delayed eviction: the first W global layers (half, by default)
 * keep a relaxed budget (warmup x k) until the last chunk, then keep the tokens the first layer
 * after them (W; the deepest delayed one when every layer is delayed) chose, so the early layers'
 * weaker scores never decide alone (§4.3). Saves memory. */
#include "engine/policy/policy.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/policy/pol_util.h"
#include "engine/policy/trace.h"

enum { P_CHUNK, P_PROBE, P_ALPHA, P_BUDGET, P_DELAY, P_WARMUP, P_KERNEL, P_POOL, P_COUNT };

static const pol_choice pools[] = { { "avg", NULL }, { "max", NULL }, { NULL, NULL } };

static const pol_param params[] = {
    [P_CHUNK] = { "chunk", POL_INT, 512, 16, 8192, NULL, "prefill chunk Z (tokens; at most the engine's --batch)" },
    [P_PROBE] = { "probe", POL_INT, 32, 1, 64, NULL, "probe tokens p: the question (at most its last p tokens), run with every chunk" },
    [P_ALPHA] = { "alpha", POL_FLOAT, 0.5, 0, 1, NULL, "EMA weight of the newest chunk's probe query" },
    [P_BUDGET] = { "budget", POL_FLOAT, 1024, 0, 1e9, NULL, "tokens k kept per layer and KV head after each chunk (fraction or count)" },
    [P_DELAY] = { "delay", POL_FLOAT, 0.5, 0, 1, NULL, "share W of the global layers with delayed eviction" },
    [P_WARMUP] = { "warmup", POL_FLOAT, 2, 1, 64, NULL, "budget of the delayed layers before the last chunk, times k" },
    [P_KERNEL] = { "kernel", POL_INT, 7, 1, 255, NULL, "pooling kernel over the probe scores" },
    [P_POOL] = { "pool", POL_ENUM, 0, 0, 0, pools, "pooling: the paper's average (eq. 11), or max" },
};
_Static_assert(POL_COUNT(params) == P_COUNT && P_COUNT <= POL_MAX_PARAMS, "take: one entry per parameter");

typedef struct st_take {
    int chunk, probe, kernel, avg;
    double alpha, budget, warmup;
    int n_delay;             /* W: global layers 0 .. W-1 (in global order) are delayed */
    int src;                 /* the global layer whose last choice they take: W, or W-1 when W is all */
    int64_t row;
    int n_layer;
    float **ema;             /* per layer: [probe][row] smoothed probe queries */
    int *have;               /* per layer: chunks seen in this eval */
    int *gidx;               /* layer -> index in the global list (-1: not global) */
    int64_t kept_last, peak_last, probe_rows_last;
    int64_t **keep_pos;      /* per KV head: positions layer W-1 kept, ascending, for the delayed layers */
    int64_t *n_keep_pos;
    int n_head_kv;
} st_take;

static void t_destroy(void *st)
{
    st_take *s = st;
    if (!s) return;
    for (int i = 0; s->ema && i < s->n_layer; i++) free(s->ema[i]);
    free(s->ema);
    free(s->have);
    free(s->gidx);
    for (int g = 0; s->keep_pos && g < s->n_head_kv; g++) free(s->keep_pos[g]);
    free(s->keep_pos);
    free(s->n_keep_pos);
    free(s);
}

static int t_create(void **out, const pol_env *env, const double *vals, char *err, size_t errlen)
{
    st_take *s = calloc(1, sizeof *s);
    if (!s) goto oom;
    s->chunk = (int)vals[P_CHUNK];
    s->probe = (int)vals[P_PROBE];
    s->alpha = vals[P_ALPHA];
    s->budget = vals[P_BUDGET];
    s->warmup = vals[P_WARMUP];
    s->kernel = (int)vals[P_KERNEL];
    s->avg = vals[P_POOL] == 0;
    s->n_delay = (int)floor(vals[P_DELAY] * env->n_global);
    s->src = s->n_delay < env->n_global ? s->n_delay : s->n_delay - 1;
    s->row = (int64_t)env->n_head * env->head_dim;
    s->n_layer = kv_n_layer(env->kv);
    s->ema = calloc((size_t)s->n_layer, sizeof *s->ema);
    s->have = calloc((size_t)s->n_layer, sizeof *s->have);
    s->gidx = malloc(sizeof(int) * (size_t)s->n_layer);
    s->n_head_kv = env->n_head_kv;
    s->n_keep_pos = calloc((size_t)env->n_head_kv, sizeof *s->n_keep_pos);
    s->keep_pos = calloc((size_t)env->n_head_kv, sizeof *s->keep_pos);
    if (!s->ema || !s->have || !s->gidx || !s->n_keep_pos || !s->keep_pos) goto oom;
    for (int i = 0; i < s->n_layer; i++) s->gidx[i] = -1;
    for (int i = 0; i < env->n_global; i++) {
        s->gidx[env->global[i]] = i;
        s->ema[env->global[i]] = malloc(sizeof(float) * (size_t)(s->probe * s->row));
        if (!s->ema[env->global[i]]) goto oom;
    }
    *out = s;
    return 0;
oom:
    t_destroy(s);
    snprintf(err, errlen, "out of memory");
    return -1;
}

static int t_check(void *st, const pol_env *env, int64_t ctx, char *err, size_t errlen)
{
    (void)env;
    st_take *s = st;
    int64_t b = pol_budget_tokens(s->budget, ctx);
    if (b < s->probe) {
        snprintf(err, errlen, "take: budget %lld tokens is below the %d probe tokens", (long long)b, s->probe);
        return -1;
    }
    return 0;
}

static pol_shape t_prefill_shape(void *st) { return (pol_shape){ ((st_take *)st)->chunk, ((st_take *)st)->probe }; }

/* Layer il's cached tokens scored by layer il's smoothed probe (n_p rows at positions from pp0),
 * every KV head in one call: head g's masses at (*mass)[(*tok0)[g] ..]. 0, or -1 when out of
 * memory. */
static int score_layer(st_take *s, const pol_env *env, int il, int64_t n_p, int64_t pp0, float **mass, int64_t **tok0)
{
    return pol_layer_mass(env, il, s->ema[il], n_p, s->row, pp0, mass, tok0);
}

/* Head g's masses (T of them) pooled into *pooled_out, its positions into *pos_out. 0, or -1 when
 * out of memory. */
static int pool_head(st_take *s, const pol_env *env, int il, int g, const float *mass, int64_t T, float **pooled_out,
                     int32_t **pos_out)
{
    float *pooled = malloc(sizeof(float) * (size_t)(T > 0 ? T : 1));
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)(T > 0 ? T : 1));
    if (!pooled || !pos) {
        free(pooled);
        free(pos);
        return -1;
    }
    pol_head_positions(env, il, g, pos);
    pol_pool(mass, T, s->kernel, s->avg, pooled);
    *pooled_out = pooled;
    *pos_out = pos;
    return 0;
}

/* The trace of a choice: the kept tokens are idx[0..nk) of T. */
static void trace_keep(const pol_env *env, const char *what, int il, int g, const float *score, const int32_t *pos,
                       int64_t T, const int64_t *idx, int64_t nk)
{
    unsigned char *kept = calloc((size_t)(T > 0 ? T : 1), 1);
    if (!kept) return;
    for (int64_t i = 0; i < nk; i++) kept[idx[i]] = 1;
    pol_trace_tokens(env->trace, what, il, g, T, score, kept, pos);
    free(kept);
}

/* A layer's choice: every KV head's top tokens, chosen before any head is evicted (the heads'
 * masses were computed together, and a head's choice reads only its own positions and masses, so
 * the heads are chosen at once on the backend's host threads, in any order), then each head's
 * eviction, one after another on this thread. */
typedef struct layer_choice {
    st_take *s;
    const pol_env *env;
    int il, save;              /* save: record the kept positions (the source layer's choice) */
    int64_t k;
    const float *mass;
    const int64_t *tok0;
    int64_t **idx, *nk;        /* [n_head_kv] head g's kept indices (NULL: out of memory) and count */
} layer_choice;

/* Head g keeps its top k tokens by pooled score (all of them when T <= k), recording the kept
 * positions when save is set. */
static void choose_head(void *ctx, int64_t gi, int thread)
{
    (void)thread;
    layer_choice *c = ctx;
    st_take *s = c->s;
    const int g = (int)gi;
    const int64_t T = c->tok0[g + 1] - c->tok0[g];
    float *score;
    int32_t *pos;
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)(T > 0 ? T : 1));
    if (!idx || pool_head(s, c->env, c->il, g, c->mass + c->tok0[g], T, &score, &pos)) {
        free(idx);
        return;
    }
    int64_t nk = pol_top_k64(score, T, c->k, idx);
    if (c->env->trace) trace_keep(c->env, "take pooled probe attention", c->il, g, score, pos, T, idx, nk);
    if (c->save) {
        int64_t *np = realloc(s->keep_pos[g], sizeof(int64_t) * (size_t)(nk > 0 ? nk : 1));
        if (!np) {
            free(idx);
            idx = NULL;
        } else {
            s->keep_pos[g] = np;
            for (int64_t i = 0; i < nk; i++) np[i] = pos[idx[i]];
            s->n_keep_pos[g] = nk;
        }
    }
    free(score);
    free(pos);
    c->idx[g] = idx;
    c->nk[g] = nk;
}

/* Every KV head of layer il keeps its top k tokens by the masses (choose_head), then the cache
 * evicts the rest. 0, or -1 when out of memory. */
static int keep_top_layer(st_take *s, const pol_env *env, int il, const float *mass, const int64_t *tok0, int64_t k,
                          int save)
{
    const int H = env->n_head_kv;
    layer_choice c = { s, env, il, save, k, mass, tok0, calloc((size_t)H, sizeof(int64_t *)),
                       calloc((size_t)H, sizeof(int64_t)) };
    int rc = c.idx && c.nk ? 0 : -1;
    /* the trace is written in head order, from this thread */
    if (!rc) be_host_run(env->trace ? NULL : env->b, choose_head, &c, H);
    for (int g = 0; g < H && !rc; g++) {
        const int64_t T = tok0[g + 1] - tok0[g];
        if (!c.idx[g]) rc = -1;
        else if (c.nk[g] < T) rc = kv_keep_tokens_on(env->kv, env->b, il, g, c.idx[g], c.nk[g]);
    }
    for (int g = 0; c.idx && g < H; g++) free(c.idx[g]);
    free(c.idx);
    free(c.nk);
    return rc;
}

/* Delayed layer il keeps the positions the source layer kept (per KV head) that it still holds, and
 * fills the rest of its k tokens by its own probe scores (a delayed layer may have dropped some of
 * those during warm-up; it must not end up with fewer than k tokens). */
static int keep_positions(st_take *s, const pol_env *env, int il, int g, int64_t k, const float *mass, int64_t T)
{
    float *score;
    int32_t *pos;
    if (pool_head(s, env, il, g, mass, T, &score, &pos)) return -1;
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)(T > 0 ? T : 1));
    char *chosen = calloc((size_t)(T > 0 ? T : 1), 1);
    if (!idx || !chosen) {
        free(score);
        free(pos);
        free(idx);
        free(chosen);
        return -1;
    }
    const int64_t *want = s->keep_pos[g];
    int64_t nw = s->n_keep_pos[g], nk = 0, w = 0;
    for (int64_t j = 0; j < T && w < nw; j++) {   /* both ascending by position */
        while (w < nw && want[w] < pos[j]) w++;
        if (w < nw && want[w] == pos[j]) {
            chosen[j] = 1;
            nk++;
        }
    }
    if (nk < k) {
        for (int64_t j = 0; j < T; j++)
            if (chosen[j]) score[j] = INFINITY;   /* already in: rank first */
        int64_t n = pol_top_k64(score, T, k, idx);
        for (int64_t i = 0; i < n; i++) chosen[idx[i]] = 1;
    }
    nk = 0;
    for (int64_t j = 0; j < T; j++)
        if (chosen[j]) idx[nk++] = j;
    if (env->trace) trace_keep(env, "take delayed layer (the source layer's choice first)", il, g, score, pos, T, idx, nk);
    int rc = nk < T ? kv_keep_tokens_on(env->kv, env->b, il, g, idx, nk) : 0;
    free(score);
    free(pos);
    free(idx);
    free(chosen);
    return rc;
}

static int t_layer_done(void *st, const pol_env *env, int il, const pol_chunk *c, char *err, size_t errlen)
{
    st_take *s = st;
    if (c->decoding || s->gidx[il] < 0) return 0;
    /* the probe rows of this chunk: appended rows, or on the last chunk its own last rows */
    int64_t n_p, pp0;
    const float *qp;
    if (c->n_probe > 0) {
        n_p = c->n_probe;
        pp0 = c->probe_p0;
        qp = c->q + c->n * s->row;
    } else if (c->last) {
        n_p = c->n < c->probe_len ? c->n : c->probe_len;
        pp0 = c->p0 + c->n - n_p;
        qp = c->q + (c->n - n_p) * s->row;
    } else {
        return 0;   /* a chunk without probe rows (prompt shorter than a chunk plus its probe) */
    }
    float *ema = s->ema[il];
    if (s->have[il] == 0) {
        memcpy(ema, qp, sizeof(float) * (size_t)(n_p * s->row));
    } else {
        float a = (float)s->alpha;
        for (int64_t i = 0; i < n_p * s->row; i++) ema[i] = a * qp[i] + (1.0f - a) * ema[i];
    }
    s->have[il]++;
    int64_t end = c->n_probe > 0 ? c->probe_p0 + c->n_probe : c->p0 + c->n;
    int64_t k = pol_budget_tokens(s->budget, end);
    int gi = s->gidx[il];
    int delayed = gi < s->n_delay;
    int64_t kk = delayed && !c->last ? (int64_t)(s->warmup * (double)k) : k;
    int src = c->last && gi == s->src && s->n_delay > 0;   /* the delayed layers take this layer's choice */
    int64_t *tok0;
    float *mass;
    /* a delayed layer's last chunk is decided by the source layer below */
    if (!(delayed && c->last && !src)) {
        if (score_layer(s, env, il, n_p, pp0, &mass, &tok0)) {
            snprintf(err, errlen, "take: out of memory");
            return -1;
        }
        int rc = keep_top_layer(s, env, il, mass, tok0, kk, src);
        free(mass);
        free(tok0);
        if (rc) {
            snprintf(err, errlen, "take: out of memory evicting");
            return -1;
        }
    }
    if (src) {
        /* the delayed layers keep the positions the source layer chose */
        for (int j = 0; j < s->n_delay; j++) {
            if (j == s->src) continue;
            int jl = env->global[j], rc = score_layer(s, env, jl, n_p, pp0, &mass, &tok0);
            for (int g = 0; g < env->n_head_kv && !rc; g++)
                rc = keep_positions(s, env, jl, g, k, mass + tok0[g], tok0[g + 1] - tok0[g]);
            free(mass);   /* NULL when the scoring failed */
            free(tok0);
            if (rc) {
                snprintf(err, errlen, "take: out of memory evicting");
                return -1;
            }
        }
    }
    if (c->last) {
        s->have[il] = 0;   /* this layer's next eval starts its own EMA (the later layers' last chunks still blend) */
        s->kept_last = pol_head_positions(env, il, 0, NULL);
        s->peak_last = kv_peak_layer_tokens(env->kv, il);
    }
    return 0;
}

static void t_describe(void *st, char *buf, size_t len)
{
    st_take *s = st;
    snprintf(buf, len, "take: chunk %d, probe of at most %d tokens, %lld tokens kept per head, peak %lld per "
             "layer", s->chunk, s->probe, (long long)s->kept_last, (long long)s->peak_last);
}

const pol_ops pol_take = {
    .name = "take",
    .summary = "TAKE: chunked prefill keeping the top tokens by a question probe's attention after each chunk",
    .stage = POL_STAGE_PREFILL,
    .prefill_only = 1,
    .params = params,
    .n_params = P_COUNT,
    .create = t_create,
    .destroy = t_destroy,
    .prefill_shape = t_prefill_shape,
    .layer_done = t_layer_done,
    .query_rows = pol_probe_query_rows,
    .check = t_check,
    .describe = t_describe,
};
