/* pol_util.c - top-k selection for the policies (see pol_util.h). */
#include "engine/policy/pol_util.h"

#include <math.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "common/logit_pick.h"
#include "engine/page_list.h"
#include "kernels/backend.h"

/* qsort has no context argument; the score array of the current call lives here. Policies run on
 * the engine's single control thread, so one static is enough. */
static const float *cmp_score;

static int by_score_desc(const void *a, const void *b)
{
    int i = *(const int *)a, j = *(const int *)b;
    float si = cmp_score[i], sj = cmp_score[j];
    if (si > sj) return -1;
    if (si < sj) return 1;
    return (i > j) - (i < j);
}

static int by_index(const void *a, const void *b)
{
    int i = *(const int *)a, j = *(const int *)b;
    return (i > j) - (i < j);
}

int pol_top_k(int *idx, int n, const float *score, int k)
{
    if (k > n) k = n;
    if (k <= 0) return 0;
    if (k < n) {
        cmp_score = score;
        qsort(idx, (size_t)n, sizeof *idx, by_score_desc);
    }
    qsort(idx, (size_t)k, sizeof *idx, by_index);
    return k;
}

int64_t pol_head_positions(const pol_env *env, int il, int g, int32_t *pos)
{
    int64_t T = 0;
    int np = kv_n_pages(env->kv, il, g);
    for (int i = 0; i < np; i++) {
        const kv_page *p = kv_layer_page(env->kv, il, g, i);
        if (pos) for (int32_t t = 0; t < p->n; t++) pos[T + t] = p->pos[t];
        T += p->n;
    }
    return T;
}

/* The mass of KV heads g0 .. g0 + n_kv of layer il, in one op call. */
static int64_t mass_heads(const pol_env *env, int il, int g0, int n_kv, const float *q, int64_t n, int64_t q_stride,
                          int64_t qpos0, float *acc)
{
    int G = env->n_head / env->n_head_kv, np = 0;
    int64_t *hp = malloc(sizeof(int64_t) * (size_t)(n_kv + 1)), T = 0, most = 0;
    if (!hp) return -1;
    hp[0] = 0;
    for (int h = 0; h < n_kv; h++) {
        np += kv_n_pages(env->kv, il, g0 + h);
        hp[h + 1] = np;
    }
    be_kv_page *pages = malloc(sizeof *pages * (size_t)(np > 0 ? np : 1));
    if (!pages) {
        free(hp);
        return -1;
    }
    for (int h = 0; h < n_kv; h++) {
        int64_t th = 0;
        for (int64_t i = hp[h]; i < hp[h + 1]; i++) {
            page_list_ref(&pages[i], kv_layer_page(env->kv, il, g0 + h, (int)(i - hp[h])), NULL, env->head_dim,
                          kv_page_size(env->kv));
            th += pages[i].n;
        }
        T += th;
        if (th > most) most = th;
    }
    /* room for up to 64 query rows' weights side by side (the backend's threads take a row each),
     * fewer where memory is short, one row's at least */
    int64_t rows = n * G < 64 ? n * G : 64;
    float *work = NULL;
    while (most > 0 && rows >= 1 && !(work = malloc(sizeof(float) * (size_t)(rows * most)))) rows /= 2;
    if (most > 0 && n > 0 && !work) {
        free(pages);
        free(hp);
        return -1;
    }
    /* the list's name on a device backend: one per cache, layer and first KV head */
    uint64_t table = ((uint64_t)(uintptr_t)env->kv * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)il << 32) ^
                     ((uint64_t)g0 << 16) ^ ((uint64_t)n_kv << 8) ^ 0x6du;
    be_mass m = { q, n, q_stride, qpos0, g0 * G, G, env->head_dim, pages, np, acc, work, rows * most, table,
                  n_kv, hp };
    if (T > 0 && n > 0) env->b->ops->attn_mass(env->b, &m);
    free(pages);
    free(work);
    free(hp);
    return T;
}

int64_t pol_attn_mass_layer(const pol_env *env, int il, const float *q, int64_t n, int64_t q_stride, int64_t qpos0,
                            float *acc)
{
    return mass_heads(env, il, 0, env->n_head_kv, q, n, q_stride, qpos0, acc);
}

int64_t pol_layer_tokens(const pol_env *env, int il, int64_t *tok0)
{
    tok0[0] = 0;
    for (int g = 0; g < env->n_head_kv; g++) tok0[g + 1] = tok0[g] + kv_head_tokens(env->kv, il, g);
    return tok0[env->n_head_kv];
}

int pol_layer_mass(const pol_env *env, int il, const float *q, int64_t n, int64_t q_stride, int64_t qpos0, float **mass,
                   int64_t **tok0)
{
    *tok0 = malloc(sizeof(int64_t) * (size_t)(env->n_head_kv + 1));
    int64_t all = *tok0 ? pol_layer_tokens(env, il, *tok0) : 0;
    *mass = *tok0 ? calloc((size_t)(all > 0 ? all : 1), sizeof(float)) : NULL;
    if (!*mass || pol_attn_mass_layer(env, il, q, n, q_stride, qpos0, *mass) < 0) {
        free(*tok0);
        free(*mass);
        *tok0 = NULL;
        *mass = NULL;
        return -1;
    }
    return 0;
}

/* The k-th largest of key[0..n) (distinct, 1 <= k <= n), the array reordered: a quickselect with a
 * median-of-three pivot, O(n) expected. */
static uint64_t kth_largest(uint64_t *key, int64_t n, int64_t k)
{
    int64_t lo = 0, hi = n;   /* key[0..lo) are larger than key[lo..hi), which are larger than the rest */
    for (;;) {
        if (hi - lo == 1) return key[lo];
        int64_t m = lo + (hi - lo) / 2, last = hi - 1;
        uint64_t a = key[lo], b = key[m], c = key[last];
        int64_t pi = (a < b) == (b < c) ? m : (b < a) == (a < c) ? lo : last;   /* the median's place */
        uint64_t p = key[pi], t;
        key[pi] = key[last];
        key[last] = p;
        int64_t at = lo;
        for (int64_t i = lo; i < last; i++)
            if (key[i] > p) {
                t = key[i];
                key[i] = key[at];
                key[at++] = t;
            }
        key[last] = key[at];
        key[at] = p;   /* key[lo..at) > p, then p, then smaller */
        if (at == k - 1) return p;
        if (at > k - 1) hi = at;
        else lo = at + 1;
    }
}

int64_t pol_top_k64(const float *score, int64_t n, int64_t k, int64_t *out)
{
    if (k > n) k = n;
    if (k <= 0) return 0;
    uint64_t *key = (uint64_t *)out;   /* out's room holds the keys until the threshold is known */
    for (int64_t i = 0; i < n; i++) key[i] = lp_key(lp_value(score[i]), (int32_t)i);
    uint64_t th = k < n ? kth_largest(key, n, k) : 0;
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++)
        if (lp_key(lp_value(score[i]), (int32_t)i) >= th) out[m++] = i;
    return m;
}

void pol_pool(const float *x, int64_t n, int kernel, int avg, float *out)
{
    int half = kernel / 2;
    for (int64_t j = 0; j < n; j++) {
        float acc = avg ? 0.0f : -INFINITY;
        int cnt = 0;
        for (int64_t o = j - half; o <= j + half; o++) {
            if (o < 0 || o >= n) continue;
            if (avg) acc += x[o];
            else if (x[o] > acc) acc = x[o];
            cnt++;
        }
        out[j] = avg ? acc / (float)(cnt ? cnt : 1) : acc;
    }
}

/* The heap's entry i moved down to its place among its children (the larger key above). */
static void sift_down(uint64_t *h, int64_t n, int64_t i)
{
    uint64_t x = h[i];
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h[c + 1] > h[c]) c++;
        if (h[c] <= x) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
}

void pol_rank_begin(pol_ranking *r, const float *score, int64_t n, uint64_t *heap)
{
    for (int64_t i = 0; i < n; i++) heap[i] = lp_key(lp_value(score[i]), (int32_t)i);
    for (int64_t i = n / 2 - 1; i >= 0; i--) sift_down(heap, n, i);
    r->heap = heap;
    r->n = n;
}

int64_t pol_rank_next(pol_ranking *r)
{
    if (r->n == 0) return -1;
    uint64_t top = r->heap[0];
    r->heap[0] = r->heap[--r->n];
    if (r->n > 0) sift_down(r->heap, r->n, 0);
    return lp_key_id(top);
}

void pol_huge_pages(void *p, size_t bytes)
{
#ifdef MADV_HUGEPAGE
    uintptr_t a = ((uintptr_t)p + 4095) & ~(uintptr_t)4095, e = ((uintptr_t)p + bytes) & ~(uintptr_t)4095;
    if (bytes >= (4u << 20) && e > a) madvise((void *)a, e - a, MADV_HUGEPAGE);   /* advice: failure is harmless */
#else
    (void)p;
    (void)bytes;
#endif
}
