/* kvcache.h - the paged key/value cache of one sequence.
 *
 * Every layer has one page table per KV head: an ordered list of pages of P tokens (default 32). A
 * page holds, per token, that KV head's key and value rows in f16 (GQA is never expanded, and a
 * method that evicts per head frees that head's pages),
 * the token's position and its log-degree (0 unless compression merged tokens into it), and per page
 * the running sum, element-wise min and element-wise max of its keys (the summaries the selection
 * policies score). Pages come from a pool and go back to it when evicted or rewound (up to 64 stay
 * allocated for reuse, the rest are freed), and every byte is counted where it is allocated or
 * released, so the memory figures are exact.
 *
 * Sliding-window layers (window > 0) keep only the pages their queries can still see, plus what a
 * rewind to a protected position needs (see kv_trim_window). */
#ifndef KVCHAT_KVCACHE_H
#define KVCHAT_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct kv_page {
    uint16_t *k, *v;       /* [page_size][head_dim] f16 */
    int32_t *pos;          /* [page_size] position of each token */
    float *logdeg;         /* [page_size] log of the number of tokens merged into it (0: one) */
    float *ksum;           /* [head_dim] sum of the keys held */
    float *kmin, *kmax;    /* [head_dim] element-wise min / max of the keys held */
    int32_t n;             /* tokens held (a prefix of the page) */
    int16_t merged;        /* 1 when some logdeg is nonzero */
    int16_t holders;       /* page tables holding it: more than 1 once a fork shares it (kv_fork;
                              a fork of a fork adds one; at most a few) */
    uint64_t gen;          /* content generation (be_kv_page.gen): new when rows below n change */
} kv_page;

typedef struct kv_cache kv_cache;
struct be_backend;

/* window[il] > 0 makes layer il a sliding-window layer of that width (NULL: all global). */
kv_cache *kv_create(int n_layer, int64_t n_ctx, int n_head_kv, int64_t head_dim, int page_size, const int32_t *window,
                    char *err, size_t errlen);
void kv_free(kv_cache *kv);
/* A second cache holding what src holds, sharing its pages: a page is copied the first time either
 * cache would change it in place (an append into a shared last page, a rewind into one), so each
 * goes on as if it had its own copy and neither sees the other's changes. Each cache's figures
 * count every page its tables hold, shared ones too (a fork's are a copy's, its peak beginning at
 * its source's; the process holds a shared page once). Either may be freed first. Its layers have
 * src's shapes (kv_layer_shape), and copying a shared last page keeps a layer's shape in both: a
 * list kept of src's tables that names no page src added after the fork holds for the fork's (but
 * for each head's last entry, which an update writes again; engine/forward.c fork_lists). What answering several policies
 * from one cache uses (sess_compare, kvchat eval --together). NULL with a message when out of
 * memory. */
kv_cache *kv_fork(const kv_cache *src, char *err, size_t errlen);

int kv_n_layer(const kv_cache *kv);
int kv_page_size(const kv_cache *kv);
int kv_n_head_kv(const kv_cache *kv);
int64_t kv_head_dim(const kv_cache *kv);
int64_t kv_n_ctx(const kv_cache *kv);
int32_t kv_window(const kv_cache *kv, int il);       /* 0 on global layers */
int64_t kv_len(const kv_cache *kv);                  /* the next position (tokens seen so far) */

/* Append n rows (f32 [n][n_head_kv * head_dim], converted to f16) at positions p0 .. p0+n-1 to every
 * KV head of layer il. -1 when out of memory. */
int kv_append(kv_cache *kv, int il, const float *k, const float *v, int64_t n, int64_t p0);
/* kv_append with the work spread over b's host threads (be_host_run; the same bytes): the pages
 * made ready on the calling thread, then each page's rows converted and folded into its summary on
 * any thread; -1 when out of memory, the tables then as they were. An append too small to gain
 * from it (a decode step's row), or b NULL, is kv_append's on the calling thread (out of memory:
 * the heads before the one that failed appended). A shared page the append copies first (a fork's
 * last page) is named to b's page_moves, which may build its copy from its copy of the shared
 * page. Between ops only. */
int kv_append_on(kv_cache *kv, struct be_backend *b, int il, const float *k, const float *v, int64_t n, int64_t p0);
/* The same for one KV head; row t starts stride floats after row t-1. */
int kv_append_head(kv_cache *kv, int il, int h, const float *k, const float *v, int64_t stride, int64_t n, int64_t p0);
/* Declare positions < len committed (after a chunk). */
void kv_commit(kv_cache *kv, int64_t len);

/* Forget every token at position >= pos, committed or not (a chunk that stopped part-way leaves
 * tokens in the layers it reached). Returns pos (or the committed length, when pos is past it), or 0
 * (after clearing everything) when a sliding-window layer no longer holds the keys a query at pos
 * would need; the caller then re-evaluates from the returned position. */
int64_t kv_rewind(kv_cache *kv, int64_t pos);
/* The most tokens one KV head of layer il has held at any time (prefill included). */
int64_t kv_peak_layer_tokens(const kv_cache *kv, int il);
/* Forget the tokens of layer il (every KV head) at positions >= pos; other layers are untouched.
 * -1 when a page shared with a fork could not be copied (out of memory): that head then still holds
 * tokens at or after pos (the caller fails). kv_rewind falls back to 0 in that case. */
int kv_truncate_layer(kv_cache *kv, int il, int64_t pos);
/* Sliding-window layers keep what a rewind to this position needs (a chat turn's start), so
 * rewinding there stays exact. */
void kv_set_floor(kv_cache *kv, int64_t pos);
/* A second protected rewind target, independent of the floor (the answer loop's page start, so
 * backtracking never disturbs the caller's floor); -1: none. */
void kv_set_mark(kv_cache *kv, int64_t pos);
/* Drop the pages of sliding-window layer il that no query at position >= q_min can see and that a
 * rewind to the floor, the mark or eval_start would not need. No-op on global layers. */
void kv_trim_window(kv_cache *kv, int il, int64_t q_min, int64_t eval_start);

/* A value that changes (to one unique in the process) whenever a page table of layer il changes
 * other than by kv_append / kv_append_head, which only add rows to a table's last page and pages
 * after it: while it stays the same, every page but each table's last is as it was (a device
 * backend keeps the layer's page descriptors and looks only at the tables' ends; be_attn.shape).
 * Pages edited in place through kv_layer_page are not seen: edit through the functions here. */
uint64_t kv_layer_shape(const kv_cache *kv, int il);

/* A value unique in the process: pages' content generations (device copies compare them), layer
 * shapes, and the generations of a policy's own summaries (be_summary.gen) are drawn from it. */
uint64_t kv_next_gen(void);

/* The page table of KV head h of layer il. */
int kv_n_pages(const kv_cache *kv, int il, int h);
kv_page *kv_layer_page(const kv_cache *kv, int il, int h, int i);
int64_t kv_head_tokens(const kv_cache *kv, int il, int h);
/* 1 when the next row appended to head h of layer il opens a page of its own (the table is empty or
 * its last page full), 0 when it goes into the last page. */
int kv_next_row_opens_page(const kv_cache *kv, int il, int h);

/* Keep only the pages whose indices are listed (ascending) in head h of layer il; the others
 * return to the pool. */
void kv_keep_pages(kv_cache *kv, int il, int h, const int *keep, int n_keep);
/* Keep only the listed tokens (ascending indices counted across the table's pages), packed densely
 * into fresh pages with their summaries; the old pages return to the pool, so memory held drops.
 * The table's first pages, full and kept whole, stay as they are (packing would write them again
 * as they are), content generations included. What eviction policies call. -1 when out of memory
 * (the table is unchanged). */
int kv_keep_tokens(kv_cache *kv, int il, int h, const int64_t *keep, int64_t n_keep);
/* kv_keep_tokens with the copying into the fresh pages spread over b's host threads, a few pages a
 * task (be_host_run; the same bytes and figures); a small one, or b NULL, on the calling thread.
 * A device backend that builds its copies of the fresh pages itself (be_ops.page_moves) is told
 * where their rows came from before the old pages go. Between ops only. */
int kv_keep_tokens_on(kv_cache *kv, struct be_backend *b, int il, int h, const int64_t *keep, int64_t n_keep);
/* Replace head h of layer il by n rows given explicitly (f32 keys and values [n][head_dim], positions
 * ascending, log-degrees; NULL logdeg: all 0), packed into fresh pages; the old pages return to the
 * pool. What merging policies call. -1 when out of memory (the table is unchanged). */
int kv_rebuild_head(kv_cache *kv, int il, int h, const float *k, const float *v, const int32_t *pos,
                    const float *logdeg, int64_t n);
/* Recompute a page's summaries from its f16 keys (after a policy edited the page in place), with a
 * new content generation. An edit to a page other than its table's last also needs a new layer
 * shape, which only the functions above give. */
void kv_page_resummarize(const kv_cache *kv, kv_page *p);
/* A fresh empty page from the pool (NULL when out of memory), and adding one to the end of layer
 * il's table; policies that rebuild pages use these. */
kv_page *kv_page_new(kv_cache *kv);
int kv_push_page(kv_cache *kv, int il, int h, kv_page *p);

typedef struct kv_stats {
    int64_t positions;         /* tokens seen (the context length) */
    int64_t tokens_kept;       /* token rows held, summed over layers and KV heads */
    int64_t tokens_full;       /* token rows a full cache would hold: positions x layers x KV heads */
    uint64_t bytes_resident;   /* pages in use + page tables, counted where they are allocated */
    uint64_t bytes_full;       /* K+V of a full f16 cache of this length, no summaries */
    uint64_t bytes_peak;       /* largest bytes_resident so far (prefill included) */
    uint64_t bytes_pooled;     /* freed pages kept for reuse (at most 64), not counted as held */
    int64_t pages;             /* pages in use, all layers and KV heads */
} kv_stats;
void kv_get_stats(const kv_cache *kv, kv_stats *st);
/* Start measuring the peak afresh (from what is resident now), e.g. before a benchmark's prefill. */
void kv_reset_peak(kv_cache *kv);
/* Bytes of one page (K, V, positions, log-degrees and summaries). */
uint64_t kv_page_bytes(const kv_cache *kv);

/* Snapshots: the cache's shape, positions and every page (positions, log-degrees, f16 K and V rows;
 * the page summaries are recomputed on load). kv_load checks everything against this cache's shape
 * and the format's invariants with apply = 0 and touches nothing; with apply = 1 it replaces the
 * contents. -1 with a one-line message. */
struct bytes_w;
struct bytes_r;
void kv_save(const kv_cache *kv, struct bytes_w *w);
int kv_load(kv_cache *kv, struct bytes_r *r, int apply, char *err, size_t errlen);

#endif
