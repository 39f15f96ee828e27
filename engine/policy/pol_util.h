/* pol_util.h - small helpers shared by the policy implementations (not part of the policy API). */
#ifndef KVCHAT_POL_UTIL_H
#define KVCHAT_POL_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/policy/policy.h"

/* Reorder idx[0..n) so its first k entries are those with the highest score[idx[i]] (ties: lower
 * index first), and sort those k ascending by index. Returns min(k, n). */
int pol_top_k(int *idx, int n, const float *score, int k);

/* pol_ops.query_rows for a policy that reads the probe's queries (TAKE): a chunk's
 * appended probe rows, or on the last chunk its own last probe_len rows; none while decoding or on
 * a chunk without a probe. */
void pol_probe_query_rows(void *st, const pol_chunk *c, int64_t *r0, int64_t *r1);
/* pol_ops.query_rows for a layer_done that reads no query (SentKV, Chelsea). */
void pol_no_query_rows(void *st, const pol_chunk *c, int64_t *r0, int64_t *r1);
/* The name a policy state gives global layer il's summaries on the backend (be_bounds.table), from
 * its own serial (kv_next_gen at its creation): two states' lists never meet, not even a state made
 * where a freed one was, whose fork of the same cache has the same layer shapes (kv_fork). */
static inline uint64_t pol_bounds_table(uint64_t serial, int il) { return (serial << 20) ^ (uint64_t)(il + 1); }

/* Layer il's pages as a backend reads them, every KV head's in order: pages[hp[g] .. hp[g + 1]) head
 * g's, tok0[g] the tokens of the heads before head g (tok0[n_head_kv]: all), most the most tokens a
 * head holds, table the list's name for a device backend (one per cache and layer). */
typedef struct pol_layer_list {
    be_kv_page *pages;
    int64_t *hp, *tok0;
    int64_t most;
    uint64_t table;
} pol_layer_list;
/* 0, or -1 when out of memory (nothing held). */
int pol_layer_pages(const pol_env *env, int il, pol_layer_list *l);
void pol_layer_pages_free(pol_layer_list *l);
/* Attention mass, every KV head of layer il in one call (one wait on a device backend), into arrays
 * of its own, the caller's to free: *tok0 [n_head_kv + 1] (tok0[g]: the tokens of the heads before
 * head g; tok0[n_head_kv]: all) and *mass, where mass[tok0[g] + j] (j: token index in head g's
 * table, counted across its pages) is the softmax weight the query rows give token j, summed over
 * the n rows and the G = n_head / n_head_kv query heads sharing the KV head. Row t (q + t *
 * q_stride, all query heads) sits at position qpos0 + t and sees the tokens at positions <= its
 * own; merged tokens get their log-degree bias. Computed by the backend's attn_mass op
 * (kernels/backend.h be_mass: the same floats on every backend). 0, or -1 when out of memory
 * (both NULL). */
int pol_layer_mass(const pol_env *env, int il, const float *q, int64_t n, int64_t q_stride, int64_t qpos0, float **mass,
                   int64_t **tok0);
/* pol_layer_mass over a list pol_layer_pages made: *mass [l->tok0[n_head_kv]], the caller's. 0, or
 * -1 when out of memory. */
int pol_list_mass(const pol_env *env, const pol_layer_list *l, const float *q, int64_t n, int64_t q_stride,
                  int64_t qpos0, float **mass);
/* Tokens in head g of layer il, and their positions in table order into pos (NULL: count only). */
int64_t pol_head_positions(const pol_env *env, int il, int g, int32_t *pos);
/* out[j] = max (or mean, when avg) of x over [j - kernel/2, j + kernel/2] clipped to [0, n). */
void pol_pool(const float *x, int64_t n, int kernel, int avg, float *out);
/* Ask for huge pages under a large buffer about to be filled (bytes from 4 MiB): at the 7B shape a
 * policy's summaries of 32K tokens take hundreds of MiB, and faulting them in 4 KiB at a time can
 * cost more than computing them. Advice: nothing happens where the system has none. */
void pol_huge_pages(void *p, size_t bytes);

/* The indices of score[0..n) one at a time, highest score first (ties: lower index first; NaN as
 * -inf: the pick's order, common/logit_pick.h), without sorting them all: a heap of n keys built in
 * O(n), then O(log n) an index, for a caller that stops after the first few. */
typedef struct pol_ranking {
    uint64_t *heap;   /* [n] the caller's */
    int64_t n;
} pol_ranking;
void pol_rank_begin(pol_ranking *r, const float *score, int64_t n, uint64_t *heap);
/* The next index, or -1 when every one has been given. */
int64_t pol_rank_next(pol_ranking *r);
/* Indices of the k largest values of score[0..n) (ties: lower index first; NaN as -inf: the
 * pick's order), ascending, into out[0..k) (out has room for n; n < 2^31). O(n): a quickselect
 * finds the k-th largest, then one pass keeps what is not below it. */
int64_t pol_top_k64(const float *score, int64_t n, int64_t k, int64_t *out);

#endif
