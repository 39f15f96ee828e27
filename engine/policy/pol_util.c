/* pol_util.c - top-k selection for the policies (see pol_util.h). */
#include "engine/policy/pol_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
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

int pol_layer_pages(const pol_env *env, int il, pol_layer_list *l)
{
    const int H = env->n_head_kv;
    memset(l, 0, sizeof *l);
    l->hp = malloc(sizeof(int64_t) * (size_t)(H + 1));
    l->tok0 = malloc(sizeof(int64_t) * (size_t)(H + 1));
    if (!l->hp || !l->tok0) goto fail;
    l->hp[0] = 0;
    for (int h = 0; h < H; h++) l->hp[h + 1] = l->hp[h] + kv_n_pages(env->kv, il, h);
    l->pages = malloc(sizeof *l->pages * (size_t)(l->hp[H] > 0 ? l->hp[H] : 1));
    if (!l->pages) goto fail;
    l->tok0[0] = 0;
    for (int h = 0; h < H; h++) {
        l->tok0[h + 1] = l->tok0[h];
        for (int64_t i = l->hp[h]; i < l->hp[h + 1]; i++) {
            page_list_ref(&l->pages[i], kv_layer_page(env->kv, il, h, (int)(i - l->hp[h])), NULL, env->head_dim,
                          kv_page_size(env->kv));
            l->tok0[h + 1] += l->pages[i].n;
        }
        if (l->tok0[h + 1] - l->tok0[h] > l->most) l->most = l->tok0[h + 1] - l->tok0[h];
    }
    /* the list's name on a device backend: one per cache and layer */
    l->table = ((uint64_t)(uintptr_t)env->kv * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)il << 32) ^ 0x6d61u;
    return 0;
fail:
    pol_layer_pages_free(l);
    return -1;
}

void pol_layer_pages_free(pol_layer_list *l)
{
    free(l->pages);
    free(l->hp);
    free(l->tok0);
    memset(l, 0, sizeof *l);
}

int pol_list_mass(const pol_env *env, const pol_layer_list *l, const float *q, int64_t n, int64_t q_stride,
                  int64_t qpos0, float **mass_out)
{
    const int H = env->n_head_kv, G = env->n_head / H;
    float *mass = calloc((size_t)(l->tok0[H] > 0 ? l->tok0[H] : 1), sizeof(float)), *work = NULL;
    *mass_out = NULL;
    if (!mass) return -1;
    /* room for up to 64 query rows' weights side by side (the backend's threads take a row each),
     * fewer where memory is short, one row's at least */
    int64_t rows = n * G < 64 ? n * G : 64;
    while (l->most > 0 && rows >= 1 && !(work = malloc(sizeof(float) * (size_t)(rows * l->most)))) rows /= 2;
    if (l->most > 0 && n > 0 && !work) {
        free(mass);
        return -1;
    }
    be_mass m = { q, n, q_stride, qpos0, 0, G, env->head_dim, l->pages, l->hp[H], mass, work, rows * l->most, l->table,
                  H, l->hp };
    if (l->tok0[H] > 0 && n > 0) env->b->ops->attn_mass(env->b, &m);
    free(work);
    *mass_out = mass;
    return 0;
}

int pol_layer_mass(const pol_env *env, int il, const float *q, int64_t n, int64_t q_stride, int64_t qpos0,
                   float **mass_out, int64_t **tok0_out)
{
    pol_layer_list l;
    *mass_out = NULL;
    *tok0_out = NULL;
    if (pol_layer_pages(env, il, &l)) return -1;
    if (pol_list_mass(env, &l, q, n, q_stride, qpos0, mass_out)) {
        pol_layer_pages_free(&l);
        return -1;
    }
    *tok0_out = l.tok0;
    l.tok0 = NULL;
    pol_layer_pages_free(&l);
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

void pol_probe_query_rows(void *st, const pol_chunk *c, int64_t *r0, int64_t *r1)
{
    (void)st;
    *r0 = *r1 = 0;
    if (c->decoding) return;
    if (c->n_probe > 0) {
        *r0 = c->n;
        *r1 = c->n + c->n_probe;
    } else if (c->last) {
        *r0 = c->n - (c->n < c->probe_len ? c->n : c->probe_len);
        *r1 = c->n;
    }
}

void pol_no_query_rows(void *st, const pol_chunk *c, int64_t *r0, int64_t *r1)
{
    (void)st, (void)c;
    *r0 = *r1 = 0;
}
