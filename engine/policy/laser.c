/* laser.c - LASER-KV: accumulative selection over blocks with Exact+LSH recall.
 *
 * The prompt is taken in blocks of `block` tokens (S_block). The global budget is
 * floor(2 r S_block T / (S_block + T)) for a prompt of T tokens and ratio r (the budget as a
 * fraction of T), split evenly over the blocks. When a block is complete (and at the end of the
 * prompt) it is compressed to its budget B, the same tokens in every global layer and KV head:
 *   - B/n sink tokens (the block's first; n = `protect`) and B/n recent tokens (its last),
 *   - of the rest, `alpha` (the paper's 0.75) by exact attention: the question probe's softmax
 *     attention (the question's tokens, at most its last `probe`, run with every chunk like TAKE's;
 *     the prompt's last `probe` tokens when no question is known) summed over all global layers and
 *     heads,
 *   - the remainder by LSH: the rate at which a token's key and the probe's query fall in the same
 *     SimHash bucket over `rounds` rounds of `bits` random hyperplanes (seeded), summed likewise.
 * Selection is append-only: what earlier blocks kept is never revisited, except that the previous
 * block's recent tokens are looked back at and compete again in the next block. Saves memory. */
#include "engine/policy/policy.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/policy/laser.h"
#include "engine/policy/pol_util.h"
#include "engine/policy/trace.h"

enum { P_BLOCK, P_BUDGET, P_PROTECT, P_ALPHA, P_ROUNDS, P_BITS, P_SEED, P_PROBE, P_COUNT };

static const pol_param params[] = {
    [P_BLOCK] = { "block", POL_INT, 4096, 64, 1 << 20, NULL, "block size S_block (tokens)" },
    [P_BUDGET] = { "budget", POL_FLOAT, 0.2, 0, 1e9, NULL, "ratio r of the prompt kept (fraction; a count is turned into r = count / T)" },
    [P_PROTECT] = { "protect", POL_INT, 4, 2, 64, NULL, "protection divisor n: B/n sinks and B/n recent tokens per block" },
    [P_ALPHA] = { "alpha", POL_FLOAT, 0.75, 0, 1, NULL, "share of the recall chosen by exact attention (the rest by LSH; the paper's 0.75)" },
    [P_ROUNDS] = { "rounds", POL_INT, 8, 1, 64, NULL, "SimHash rounds R" },
    [P_BITS] = { "bits", POL_INT, 8, 1, 30, NULL, "hyperplanes per round" },
    [P_SEED] = { "seed", POL_INT, 42, 0, 1e9, NULL, "seed of the hyperplanes" },
    [P_PROBE] = { "probe", POL_INT, 32, 1, 64, NULL, "probe tokens: the question (at most this many of its last tokens), run with every chunk" },
};
_Static_assert(POL_COUNT(params) == P_COUNT && P_COUNT <= POL_MAX_PARAMS, "laser: one entry per parameter");

typedef struct st_laser {
    int block, protect, rounds, bits, probe;
    double budget, alpha;
    uint64_t seed;
    int64_t row;
    float *planes_t;         /* [head_dim][rounds * bits]: the hyperplanes, transposed (be_lsh) */
    int64_t done_upto;       /* positions below this are settled memory (append-only) */
    int64_t block_start;     /* first position of the block being collected (look-back included) */
    float *exact, *lsh;      /* per position: scores summed over layers and heads for this block */
    int64_t cap;
    int last_global;
    int64_t kept_total, blocks;
} st_laser;

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void laser_planes(uint64_t seed, int rounds, int bits, int D, float *planes_t)
{
    const size_t P = (size_t)rounds * (size_t)bits;
    uint64_t x = seed;
    for (size_t p = 0; p < P; p++)
        for (size_t i = 0; i < (size_t)D; i++) {
            double u1 = ((double)(splitmix(&x) >> 11) + 1.0) / 9007199254740993.0;
            double u2 = (double)(splitmix(&x) >> 11) / 9007199254740992.0;
            planes_t[i * P + p] = (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
        }
}

static void la_destroy(void *st)
{
    st_laser *s = st;
    if (!s) return;
    free(s->planes_t);
    free(s->exact);
    free(s->lsh);
    free(s);
}

static int la_create(void **out, const pol_env *env, const double *vals, char *err, size_t errlen)
{
    st_laser *s = calloc(1, sizeof *s);
    if (!s) goto oom;
    s->block = (int)vals[P_BLOCK];
    s->budget = vals[P_BUDGET];
    s->protect = (int)vals[P_PROTECT];
    s->alpha = vals[P_ALPHA];
    s->rounds = (int)vals[P_ROUNDS];
    s->bits = (int)vals[P_BITS];
    s->seed = (uint64_t)vals[P_SEED];
    s->probe = (int)vals[P_PROBE];
    s->row = (int64_t)env->n_head * env->head_dim;
    s->last_global = env->n_global > 0 ? env->global[env->n_global - 1] : -1;
    s->planes_t = malloc(sizeof(float) * (size_t)s->rounds * (size_t)s->bits * (size_t)env->head_dim);
    if (!s->planes_t) goto oom;
    laser_planes(s->seed, s->rounds, s->bits, env->head_dim, s->planes_t);
    *out = s;
    return 0;
oom:
    la_destroy(s);
    snprintf(err, errlen, "out of memory");
    return -1;
}

/* The engine's chunks, with the probe appended to every one but the last. */
static pol_shape la_prefill_shape(void *st) { return (pol_shape){ 0, ((st_laser *)st)->probe }; }

int64_t laser_global_budget(double budget, int64_t block, int64_t T)
{
    double r = budget < 1 ? budget : budget / (double)T;
    return (int64_t)floor(2.0 * r * (double)block * (double)T / (double)(block + T));
}

/* Tokens the cache holds at the end of a prompt of T tokens when every block keeps B: each block but
 * the last hands its B / protect recent tokens on to the next one, where they compete again, and the
 * last block (its own tokens and that look-back) keeps at most B. */
static int64_t held_after(int64_t B, int64_t block, int64_t T, int protect)
{
    int64_t n = (T + block - 1) / block, tail = T - (n - 1) * block, look = n > 1 ? B / protect : 0;
    int64_t last = tail + look < B ? tail + look : B;
    return (n - 1) * (B - B / protect) + last;
}

int64_t laser_block_budget(double budget, int64_t block, int64_t T, int protect)
{
    /* The largest per-block budget whose blocks together hold no more than the global budget. Splitting
     * it evenly over the blocks instead left it partly unspent: the recent tokens handed on are counted
     * twice, and a short last block (a prompt just over a multiple of the block) cannot use its share:
     * a 4,142-token prompt at r = 0.1 held 251 tokens of its 411. */
    int64_t total = laser_global_budget(budget, block, T), lo = 0, hi = T;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (held_after(mid, block, T, protect) <= total) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static int grow(st_laser *s, int64_t n)
{
    if (n <= s->cap) return 0;
    int64_t nc = n * 2;
    float *a = realloc(s->exact, sizeof(float) * (size_t)nc);
    if (a) s->exact = a;
    float *b = realloc(s->lsh, sizeof(float) * (size_t)nc);
    if (b) s->lsh = b;
    if (!a || !b) return -1;
    memset(s->exact + s->cap, 0, sizeof(float) * (size_t)(nc - s->cap));
    memset(s->lsh + s->cap, 0, sizeof(float) * (size_t)(nc - s->cap));
    s->cap = nc;
    return 0;
}

/* Add this layer's exact and LSH scores of the block's tokens (positions >= block_start): the
 * probe's attention mass and its SimHash hits, every KV head of the layer in one call of each
 * backend op, over one page list. */
static int score_layer(st_laser *s, const pol_env *env, int il, const float *qp, int64_t n_p, int64_t pp0)
{
    const int H = env->n_head_kv, G = env->n_head / H;
    pol_layer_list l;
    if (pol_layer_pages(env, il, &l)) return -1;
    float *mass = NULL;
    const int64_t T = l.tok0[H], nq = n_p * G;
    int32_t *hits = malloc(sizeof(int32_t) * (size_t)(T > 0 ? T : 1));
    uint32_t *codes = malloc(sizeof(uint32_t) * (size_t)H * (size_t)s->rounds * (size_t)(nq > 0 ? nq : 1));
    if (!hits || !codes || pol_list_mass(env, &l, qp, n_p, s->row, pp0, &mass)) {
        free(hits);
        free(codes);
        pol_layer_pages_free(&l);
        return -1;
    }
    if (T > 0 && n_p > 0) {
        be_lsh q = { qp, n_p, s->row, 0, G, env->head_dim, s->planes_t, s->rounds, s->bits, l.pages, l.hp[H], H, l.hp,
                     s->block_start, codes, hits, l.table };
        be_lsh_hits(env->b, &q);
    }
    const float per = (float)(s->rounds * n_p * G);   /* the pairs a token's key is compared with */
    for (int64_t i = 0, j = 0; n_p > 0 && i < l.hp[H]; i++) {   /* the heads in order, as their pages */
        const be_kv_page *p = &l.pages[i];
        for (int32_t t = 0; t < p->n; t++, j++) {
            int64_t ps = p->pos[t];
            if (ps < s->block_start) continue;
            s->exact[ps] += mass[j];
            s->lsh[ps] += (float)hits[j] / per;
        }
    }
    free(hits);
    free(codes);
    free(mass);
    pol_layer_pages_free(&l);
    return 0;
}

/* The trace of a block's choice: its exact and its LSH scores, with what was kept in the end. */
static void trace_block(const st_laser *s, const pol_env *env, int64_t a, int64_t n, const unsigned char *keep)
{
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    if (!pos) return;
    for (int64_t i = 0; i < n; i++) pos[i] = (int32_t)(a + i);
    pol_trace_tokens(env->trace, "laser exact (probe attention, all layers)", -1, -1, n, s->exact + a, keep, pos);
    pol_trace_tokens(env->trace, "laser LSH collision rate", -1, -1, n, s->lsh + a, keep, pos);
    free(pos);
}

/* Choose the block's tokens and keep them (plus the settled memory) in every global layer and head. */
static int compress_block(st_laser *s, const pol_env *env, int64_t end, int64_t T_prompt, char *err, size_t errlen)
{
    int64_t a = s->block_start, n = end - a;
    int64_t B = laser_block_budget(s->budget, s->block, T_prompt, s->protect);
    if (n <= B || B <= 0) {
        s->done_upto = end;
        s->block_start = end;
        return 0;
    }
    int64_t prot = B / s->protect;
    int64_t rest = B - 2 * prot;
    int64_t n_exact = (int64_t)floor(s->alpha * (double)rest), n_lsh = rest - n_exact;
    char *keep = calloc((size_t)n, 1);
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)n);
    float *sc = malloc(sizeof(float) * (size_t)n);
    if (!keep || !idx || !sc) goto oom;
    for (int64_t i = 0; i < prot && i < n; i++) keep[i] = 1;            /* sinks */
    for (int64_t i = n - prot; i < n; i++) if (i >= 0) keep[i] = 1;     /* recent */
    for (int64_t i = 0; i < n; i++) sc[i] = keep[i] ? -INFINITY : s->exact[a + i];
    int64_t k = pol_top_k64(sc, n, n_exact, idx);
    for (int64_t i = 0; i < k; i++) if (sc[idx[i]] > -INFINITY) keep[idx[i]] = 1;
    for (int64_t i = 0; i < n; i++) sc[i] = keep[i] ? -INFINITY : s->lsh[a + i];
    k = pol_top_k64(sc, n, n_lsh, idx);
    for (int64_t i = 0; i < k; i++) if (sc[idx[i]] > -INFINITY) keep[idx[i]] = 1;
    if (env->trace) trace_block(s, env, a, n, (const unsigned char *)keep);
    for (int gl = 0; gl < env->n_global; gl++) {
        int il = env->global[gl];
        for (int g = 0; g < env->n_head_kv; g++) {
            int64_t T = pol_head_positions(env, il, g, NULL);
            int32_t *pos = malloc(sizeof(int32_t) * (size_t)(T > 0 ? T : 1));
            int64_t *ki = malloc(sizeof(int64_t) * (size_t)(T > 0 ? T : 1));
            if (!pos || !ki) {
                free(pos);
                free(ki);
                goto oom;
            }
            pol_head_positions(env, il, g, pos);
            int64_t nk = 0;
            for (int64_t j = 0; j < T; j++)
                if (pos[j] < a || pos[j] >= end || keep[pos[j] - a]) ki[nk++] = j;
            int rc = nk < T ? kv_keep_tokens_on(env->kv, env->b, il, g, ki, nk) : 0;
            free(pos);
            free(ki);
            if (rc) goto oom;
        }
    }
    int64_t kept = 0;
    for (int64_t i = 0; i < n; i++) kept += keep[i];
    s->kept_total += kept - prot;   /* the recent tokens are looked back at by the next block */
    s->blocks++;
    /* append-only: all but the recent tokens are settled; the next block starts at its look-back */
    s->done_upto = end - prot;
    s->block_start = end - prot;
    for (int64_t i = 0; i < n; i++) s->exact[a + i] = s->lsh[a + i] = 0;
    free(keep);
    free(idx);
    free(sc);
    return 0;
oom:
    free(keep);
    free(idx);
    free(sc);
    snprintf(err, errlen, "laser: out of memory");
    return -1;
}

static int la_layer_done(void *st, const pol_env *env, int il, const pol_chunk *c, char *err, size_t errlen)
{
    st_laser *s = st;
    if (c->decoding) return 0;
    if (c->p0 == 0) {   /* a new prompt from the start */
        s->done_upto = s->block_start = 0;
    }
    int64_t end = c->p0 + c->n;
    int64_t T_prompt = c->n_probe > 0 ? c->probe_p0 + c->n_probe : end;
    int block_full = end - s->block_start >= s->block;
    if (!block_full && !c->last) return 0;
    /* the probe: appended rows, or the last chunk's own last rows */
    int64_t n_p = c->n_probe, pp0 = c->probe_p0;
    const float *qp = c->q + c->n * s->row;
    if (n_p == 0) {
        n_p = c->n < c->probe_len ? c->n : c->probe_len;
        pp0 = end - n_p;
        qp = c->q + (c->n - n_p) * s->row;
    }
    if (grow(s, end) || score_layer(s, env, il, qp, n_p, pp0)) {
        snprintf(err, errlen, "laser: out of memory");
        return -1;
    }
    if (il != s->last_global) return 0;   /* scores are summed over all global layers first */
    return compress_block(s, env, end, T_prompt, err, errlen);
}

static void la_describe(void *st, char *buf, size_t len)
{
    st_laser *s = st;
    snprintf(buf, len, "laser: %lld blocks compressed, %lld tokens recalled (sinks, exact and LSH), probe of at most "
             "%d tokens", (long long)s->blocks, (long long)s->kept_total, s->probe);
}

/* Across evals only the settled boundary matters (a block's scores live within one eval). */
static void la_save(void *st, bytes_w *w)
{
    st_laser *s = st;
    bw_i64(w, s->done_upto);
    bw_i64(w, s->block_start);
    bw_i64(w, s->kept_total);
    bw_i64(w, s->blocks);
}

static int la_load(void *st, const pol_env *env, bytes_r *r)
{
    st_laser *s = st;
    int64_t d = br_i64(r), b = br_i64(r), k = br_i64(r), n = br_i64(r);
    if (r->err || d < 0 || b < 0 || d > kv_n_ctx(env->kv) || b > kv_n_ctx(env->kv) || k < 0 || n < 0 ||
        n > kv_n_ctx(env->kv))
        return -1;
    s->done_upto = d;
    s->block_start = b;
    s->kept_total = k;
    s->blocks = n;
    return 0;
}

/* The probe's rows la_layer_done may read: TAKE's, but on any chunk without a probe its own last
 * rows, as on a last chunk (a block may fill there); asked before the chunk, so a superset of what
 * a chunk that fills no block reads. */
static void la_query_rows(void *st, const pol_chunk *c, int64_t *r0, int64_t *r1)
{
    pol_chunk as_last = *c;
    as_last.last = 1;
    pol_probe_query_rows(st, &as_last, r0, r1);
}

const pol_ops pol_laser = {
    .name = "laser",
    .summary = "LASER-KV: per-block sinks + recent + Exact/LSH recall of a question probe, append-only",
    .stage = POL_STAGE_PREFILL,
    .prefill_only = 1,
    .params = params,
    .n_params = P_COUNT,
    .create = la_create,
    .destroy = la_destroy,
    .prefill_shape = la_prefill_shape,
    .layer_done = la_layer_done,
    .query_rows = la_query_rows,
    .describe = la_describe,
    .save = la_save,
    .load = la_load,
};
