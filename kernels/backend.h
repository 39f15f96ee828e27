/* backend.h - the op table the forward pass runs on.
 *
 * The engine calls these ops and never knows which device executes them. Two implementations:
 * kernels/cpu/backend_cpu.c (SIMD kernels and a thread pool) and kernels/cuda/backend_cuda.cu with a
 * file per op beside it (cuBLAS and CUDA kernels, built with `make CUDA=1`). All activations are f32 row-major
 * [rows][cols] named by host addresses; weights stay in their GGUF encoding (be_weight points into
 * the mapped file) and a device backend keeps its own copies.
 *
 * Residency: the forward pass binds its scratch buffers (be_bind_blank where only ops write them,
 * be_bind where their host bytes count). A device backend keeps a twin of
 * each on the device and leaves op outputs there, so the host copy of a bound buffer is current only
 * after be_host_read of the range; before the host writes a bound range it calls be_host_write. Ops
 * given unbound addresses read and write host memory, as their callers expect. On the CPU backend
 * all of this is a no-op. */
#ifndef KVCHAT_BACKEND_H
#define KVCHAT_BACKEND_H

#include <stddef.h>
#include <stdint.h>

/* A 2-D weight as stored in the file: n_out rows of n_in elements. Its bytes stay at data, unchanged,
 * for the life of every backend that multiplied it (a device backend keys its copy by the address). */
typedef struct be_weight {
    const void *data;
    uint32_t type;
    int64_t n_in;
    int64_t n_out;
    size_t row_bytes;
} be_weight;

/* One matrix product of a multi-product: y[t][r] = dot(w row r, x[t]). */
typedef struct be_mm {
    const be_weight *w;
    float *y;              /* [n_tok][w->n_out] */
} be_mm;

/* One page of the KV cache as attention reads it: n tokens whose f16 key and value rows of KV head g
 * start at k + i * stride + g * head_step (v likewise). The cache keeps one page per KV head
 * (head_step 0, each head reading its own list); rows of all heads side by side work too. */
typedef struct be_kv_page {
    const uint16_t *k, *v;
    const int32_t *pos;     /* [n] token positions, ascending */
    const float *bias;      /* [n] additive logit bias (log-degree of merged tokens), or NULL */
    const uint64_t *mask;   /* bit t set: token t is attended; NULL: all n tokens */
    int32_t n;
    int32_t stride;         /* elements from one token's row to the next */
    int32_t head_step;      /* elements from KV head g's row to head g+1's (0: per-head pages) */
    /* The page's content generation: while it stays the same, rows below n never change (keys,
     * values, positions, biases; tokens are only appended), so a device copy needs only the rows
     * past what it already holds. Any other change (a reused page, a truncation) comes with a new
     * value, unique in the process. */
    uint64_t gen;
    int32_t cap;            /* rows the page can hold (a device copy is sized for them; 0: n) */
    /* [head_dim] the sum of the keys' f16 values over rows [0, n) in order, in float, where the
     * host keeps it (the cache's pages do), for a backend that reads the host's pages; NULL: none.
     * Only be_key_means reads it. */
    const float *ksum;
} be_kv_page;

/* Rows [row0, row0 + n) of a cache page that the host has just filled from f32 rows of a bound
 * buffer (a prompt chunk's K/V rows, computed on the device): row i is k + i * stride and
 * v + i * stride rounded to f16 (to nearest even, as be_host_f32_to_f16 rounds; a NaN stays a NaN),
 * at position pos0 + i. The page as attention will name it. */
typedef struct be_page_rows {
    be_kv_page page;
    int32_t row0, n, pos0;
    const float *k, *v;
    int64_t stride;        /* floats from one row to the next */
} be_page_rows;

/* Rows [dst_row, dst_row + n) of a fresh cache page that the host has just filled with rows
 * [src_row, src_row + n) of page src (keys, values, positions, biases as they are): an eviction
 * packing the kept tokens. Both pages as attention would name them; src is still held when the
 * move is made. A fresh page's moves come together, in order of its rows, and cover them all. */
typedef struct be_page_move {
    be_kv_page dst, src;
    int32_t dst_row, src_row, n;
} be_page_move;

/* Attention of a batch of queries over an explicit list of pages, read in place (never gathered).
 * Query t at position q_pos[t] sees the listed tokens with position <= q_pos[t], and on
 * sliding-window layers only those with q_pos[t] - position < window. */
typedef struct be_attn {
    const float *q;        /* [n_q][n_head * head_dim], already scaled */
    int64_t n_q;
    const int32_t *q_pos;
    int n_head, n_head_kv, head_dim;
    const be_kv_page *pages;
    int64_t n_pages;
    /* NULL: every KV head reads all n_pages pages. Else [n_head_kv + 1] offsets: KV head g (and its
     * query heads) reads pages[head_pages[g] .. head_pages[g + 1]). */
    const int64_t *head_pages;
    int32_t window;        /* 0: no sliding window */
    float *out;            /* [n_q][n_head * head_dim] */
    /* Rows not in the cache yet (a decode step or a prefill chunk whose K/V the cache takes after
     * its last layer): n_cur tokens at ascending positions cur_pos, after every page's, whose keys
     * and values are f32 [n_cur][n_head_kv * head_dim] (activations, may be bound). Every KV head
     * attends to them after its pages, rounded to f16 as the cache would hold them. 0: none. */
    const float *cur_k, *cur_v;
    const int32_t *cur_pos;
    int64_t n_cur;
    /* The caller's name for this page list (the forward pass: one per forward context and layer;
     * 0: none given). A device backend keeps each named list's page descriptors between calls and
     * sends only the entries that changed (kernels/page_tables.h); any value is correct, a list
     * unlike the last one under its name only costs more to send. */
    uint64_t table;
    /* Nonzero: a promise that, if the last call under this name gave the same shape, each KV
     * head's list has since only grown at its end (its last page took rows, pages came after it)
     * and no entry has a token mask, so a backend need not look at the earlier pages again. The
     * forward pass gives its cache's layer shape (kv_layer_shape) for lists of every page, and for
     * a policy's selection the shape of the list it keeps from step to step (engine/page_list.h
     * sel_list: new whenever the list changed other than at a head's end, or has a token mask). */
    uint64_t shape;
    /* 0, or the name of a list this call's list started as a copy of (the forward pass: a fork's
     * list of every page, copied from its source's at the fork's first call, engine/page_list.h):
     * a device backend that keeps no list under `table` may start it as a copy of the one it keeps
     * under from_table, as that list's last call left it, and `shape`'s promise then holds from
     * that call; so a fork's first step sends each head's last pages, not every page. */
    uint64_t from_table;
    /* A selection a bound_pages call made (be_bounds.best), read where that call left it: KV head g
     * reads, of its first sel_from[g] entries (the candidates the call bounded), those at the
     * ascending indices sel_best[g * sel_k ..] (sel_n_best[g] of them), then every entry from
     * sel_from[g] on, then the rows not in the cache. sel_best and sel_n_best may be bound (a
     * device backend's call left them there: no wait between the bounds and this call). NULL:
     * every entry. Needs head_pages and entries without token masks. */
    const int32_t *sel_best, *sel_n_best;
    const int64_t *sel_from;   /* [n_head_kv] */
    int32_t sel_k;
    /* A choice of tokens a bound_pages call made (be_bounds.bits), read where that call left it:
     * KV head g reads the tokens of its entries whose positions have their bit set in
     * sel_bits[g * sel_words ..] (an entry with none is left out), then the rows not in the cache.
     * May be bound, as sel_best. NULL: every token. Needs head_pages and entries without token
     * masks; not with sel_best. sel_page_tokens: the most tokens an entry holds (the cache's page
     * size), which sizes a device's masks (0: up to 4,096, the cache's limit). */
    const uint64_t *sel_bits;
    int64_t sel_words;
    int32_t sel_page_tokens;
} be_attn;

/* A range of host bytes (the host is about to read them; or a model's constants). */
typedef struct be_range {
    const void *p;
    size_t bytes;
} be_range;

/* A summary the selection policies score (Quest's pages, SentKV's segments): an element-wise key
 * minimum mn and maximum mx, [dim] each. While mn, gen and n stay the same, neither array changes
 * (a device backend keeps a copy and sends only the summaries that changed); gen 0: unknown, sent
 * every call. k, where set (Quest's): the key rows of the page the summary is of, as attention
 * names the page (be_kv_page.k, with gen and n the page's generation and rows; rows of dim halves,
 * one after another), mn and mx being the cache's fold of those n rows in order (from FLT_MAX and
 * -FLT_MAX, each f16 value kept where it is below the minimum or above the maximum so far: NaN
 * never, the first of equal ones), so a device backend holding a current copy of the page computes
 * them from it instead of receiving them (kernels/bound_kernels.h, bd_fold_elem). */
typedef struct be_summary_run be_summary_run;
typedef struct be_summary {
    const float *mn, *mx;
    uint64_t gen;
    int64_t n;
    const uint16_t *k;
    /* Or (k NULL, n_runs > 0; SentKV's segments, which span pages): mn and mx are the same fold of
     * the rows of runs[0 .. n_runs) one after another, each run rows of one page, so a device backend
     * holding current copies of all those pages folds the summary from them (n staying the summary's
     * own count, which the runs' rows need not add up to). */
    const be_summary_run *runs;
    int32_t n_runs;
} be_summary;

/* Rows [r0, r0 + n) of the page whose key rows are k (be_kv_page.k) under its generation gen: what
 * the policy folded, a device's copy holding them while the page keeps that generation. */
struct be_summary_run {
    const uint16_t *k;
    uint64_t gen;
    int32_t r0, n;
};

/* Quest's upper bound of the attention logit of each KV head's group of queries over that head's
 * summaries: for summary i of head h, u = sum over the group's queries j, in order, of
 * sum over d of max(q[j][d] * mn[d], q[j][d] * mx[d]), the inner sum in vd_bound_f32's order (16
 * lanes, then their halves, then the tail) on every backend, so the bounds are the same floats. */
typedef struct be_bounds {
    const float *q;           /* [n_head_kv][group][dim], already scaled (may be bound) */
    int n_head_kv, group;
    int64_t dim;
    const be_summary *sum;    /* head h's summaries: sum[off[h] .. off[h + 1]) */
    const int64_t *off;       /* [n_head_kv + 1] */
    /* As be_attn's: a name for this list of summaries and, nonzero, the promise that if the last
     * call under the name gave the same shape, each head's list has since only grown at its end,
     * and of the entries it had, only the last may have changed (its gen or n), so a backend need
     * not look further back. */
    uint64_t table, shape;
    /* k > 0: each head's k best summaries (clamped to BE_PICK_MAX), in lp_key's order of the bounds
     * (larger first, lower index first among equal ones, NaN as -inf, -inf never chosen), written
     * as ascending indices to best[h * k ..], n_best[h] of them. best and n_best may be bound
     * (both, to one buffer): a device backend then leaves them on the device without waiting, for
     * an attention call's selection (be_attn.sel_best) and a be_host_read after. */
    int32_t k;
    int32_t *best, *n_best;
    float *u;                 /* NULL, or every bound: [off[n_head_kv]] (those past a head's end not written) */
    /* bits non-NULL (k 0): SentKV's choice instead of the k best. Head h's summaries are segments
     * of its positions, in order: summary i covers the sum[i].n (>= 1) positions after those of the
     * summaries before it, the first from 0. Of `budget` tokens a head, the first `sinks` positions
     * and those from the segments' end up to len are always attended; the segments are then taken
     * whole by the rank of their bounds, each where it fits in the room left, until the room left is
     * below the shortest (kernels/segment_kernels.h, sg_choose), and every position attended has its
     * bit set in bits[h * words ..] (words >= (len + 63) / 64; the other bits 0). bits may be bound:
     * a device backend then leaves them there without waiting, for an attention call's choice of
     * tokens (be_attn.sel_bits) and a be_host_read after. */
    uint64_t *bits;
    int64_t words, budget, sinks, len;
    /* NULL, or [n_head_kv]: head h's summaries end at sum[end[h]] instead (off[h] <= end[h] <=
     * off[h + 1]), the entries up to off[h + 1] not read: room for a list to grow at each head's end
     * without moving the heads after it (be_bounds_count) */
    const int64_t *end;
} be_bounds;

/* Head h's summaries in r. */
static inline int64_t be_bounds_count(const be_bounds *r, int h) { return (r->end ? r->end[h] : r->off[h + 1]) - r->off[h]; }
/* The summaries of every head in r (*most: the most of any one head, at least 1). */
static inline int64_t be_bounds_total(const be_bounds *r, int64_t *most)
{
    int64_t n = 0, m = 1;
    for (int h = 0; h < r->n_head_kv; h++) {
        n += be_bounds_count(r, h);
        m = be_bounds_count(r, h) > m ? be_bounds_count(r, h) : m;
    }
    if (most) *most = m;
    return n;
}

/* The best candidates of one row of logits, for the sampler (engine/sampler.h), so that a device
 * backend sends back a few hundred bytes instead of the row. With softcap > 0 the row is first
 * soft-capped in place (l = softcap * tanh(l / softcap), with the backend's tanh), so that a reader
 * of the row afterwards sees the values the candidates came from. Every token's value is then the
 * logit with NaN read as -inf, and lp_penalize for the pen_ids (common/logit_pick.h); of the values
 * above -inf, the k best in lp_key's order (larger first, lower id first among equal ones) go to
 * val and id, n_out of them (fewer than k only when fewer are finite). With entropy set, also h
 * and vh: the entropy and varentropy of softmax(value / temp) before the penalty (temp <= 0: 1),
 * the sampler's samp_entropy (a device sums in another order, with its own exp). */
#define BE_PICK_MAX 256
typedef struct be_pick {
    float *logits;            /* [n] (may be bound); soft-capped in place */
    int32_t n;
    float softcap;            /* 0: none */
    const int32_t *pen_ids;   /* n_pen distinct ids below n (at most 4096) */
    int32_t n_pen;
    float penalty;
    int32_t k;                /* 1 .. BE_PICK_MAX (set to the count used, when clamped) */
    int entropy;
    float temp;
    float *val;               /* [k] out */
    int32_t *id;              /* [k] out */
    int32_t n_out;            /* out */
    double h, vh;             /* out, with entropy */
} be_pick;

/* A layer's attention inputs made ready, in place, in one op: every head's row of head_dim values
 * of q (n_head heads a token) and k (n_head_kv heads) normalized where its weight is given (y = x /
 * sqrt(mean(x^2) + eps) * w, as rmsnorm), then rotated at its token's position (RoPE; neox: pairs
 * (i, i + d/2), else (2i, 2i+1); theta_i = pos * freq_scale * freq_base^(-2i/d)), then q's scaled
 * by q_scale: the floats of rmsnorm, rope and a scale in that order, with one op where there were
 * five. */
typedef struct be_qk {
    float *q, *k;               /* [n_tok][n_head][head_dim], [n_tok][n_head_kv][head_dim] */
    int64_t n_tok;
    int n_head, n_head_kv, head_dim;   /* head_dim even, at most 1024 (as the model loader allows) */
    const float *q_norm, *k_norm;   /* [head_dim] each, or NULL: no normalization */
    float eps;
    const int32_t *pos;         /* [n_tok] */
    float freq_base, freq_scale;
    int neox;
    float q_scale;
} be_qk;

/* A layer's list of every page its KV heads hold, as be_attn gives one (pages, head_pages, table,
 * shape, from_table): KV head h's pages are pages[head_pages[h] .. head_pages[h + 1]). */
typedef struct be_page_list {
    const be_kv_page *pages;
    const int64_t *head_pages;   /* [n_head_kv + 1] */
    uint64_t table, shape;       /* as be_attn's; a device backend keeps the list under the name */
    uint64_t from_table;         /* as be_attn's: a fork's list that started as its source's */
} be_page_list;

/* CHESS's summary rows and anchor (engine/policy/chess.c), computed where the keys are. A row has
 * dim = n_lists * n_head_kv * head_dim floats: unit u = (list u / n_head_kv, KV head u %
 * n_head_kv) at u * head_dim. Every backend computes the same floats (kernels/mean_kernels.h):
 * - page i's part in unit u: the sum, in row order and in float, of its keys' f16 values (the
 *   page's ksum where given), times 1.0f / n (0 for an empty page);
 * - the candidates are pages [first, first + n_cand) of every head's list, in chunks of `chunk`
 *   pages (the last may be short) and grids of `grid` chunks; a chunk's part is the sum of its
 *   pages' parts in order times 1.0f / (its page count), a grid's likewise over its chunks;
 * - with unit set, each page, chunk and grid row is then scaled by (float)(1 / sqrt(s)) (0 when s
 *   is 0), s the sum in double, unit by unit in order, of each unit's sum in double, in order, of
 *   its squares;
 * - the anchor (n_last > 0): each unit's mean of the keys of its head's last n_last tokens (fewer
 *   where it holds fewer), summed oldest first, times 1.0f / their count; never scaled.
 * Rows are written for pages [p0, p1) at page_rows + i * dim (absolute page indices), chunks [c0,
 * c1) at chunk_rows + c * dim, grids [g0, g1) at grid_rows + g * dim, and the anchor's; empty
 * ranges write nothing. Outputs may be bound: a device backend leaves them there. */
typedef struct be_key_means {
    const be_page_list *lists;   /* [n_lists] */
    int n_lists, n_head_kv, head_dim;
    int64_t first, n_cand;
    int chunk, grid;
    int64_t p0, p1, c0, c1, g0, g1;
    float *page_rows, *chunk_rows, *grid_rows;
    int unit;
    int32_t n_last;
    float *anchor;               /* [dim] (n_last > 0) */
} be_key_means;

/* The attention mass the eviction policies score cached tokens by (SnapKV's votes, H2O's heavy
 * hitters, TAKE's and LASER-KV's probes; engine/policy/pol_util.h pol_layer_mass): over one KV head's
 * pages, for each query row t in order and each of the head's group of query heads in order, the
 * softmax weights of the tokens at positions <= q_pos0 + t, added into acc[j] (j: the token's index
 * counted across the pages). The floats of a plain loop: s_j = be_host_dot_f32_f16(q, k_j) (plus the
 * page's bias; -inf for a token the row does not see), the row's largest s, e_j = e^(s_j - largest)
 * by kernels/exp_poly.h, l the sum of e_j in double in kernels/mass_kernels.h's order (256 partial
 * sums, then pairwise), then acc[j] += e_j * (float)(1 / l) row after row; a row that sees no token
 * adds nothing. Every backend gives those floats. Several KV heads at once (n_kv > 1): KV head h
 * has pages[head_pages[h] .. head_pages[h + 1]), query heads first_head + h * group onwards and its
 * sums at acc + the token count of the heads before it; each is the one-head op's. work is the
 * caller's, work_len floats, at least the largest head's token count (more lets rows run side by
 * side).
 * table names the page list for a device backend, which keeps its descriptors under that name as it
 * does attention's (any value is correct; a list unlike the last one under its name only sends
 * more). */
typedef struct be_mass {
    const float *q;          /* row t's query head h at q + t * q_stride + h * head_dim, already scaled */
    int64_t n_q, q_stride, q_pos0;
    int first_head, group, head_dim;   /* the KV head's query heads: first_head .. first_head + group */
    const be_kv_page *pages;   /* the KV heads' pages (rows at k + i * stride; head_step unused) */
    int64_t n_pages;
    float *acc;                /* [the pages' tokens] */
    float *work;
    int64_t work_len;
    uint64_t table;
    int n_kv;                  /* KV heads (0 or 1: one, every page its) */
    const int64_t *head_pages; /* [n_kv + 1] when n_kv > 1 */
} be_mass;

/* LASER-KV's recall by SimHash (engine/policy/laser.c): over one or several KV heads' pages (laid
 * out as be_mass's), for each token at a position >= pos_min, hits[j] = the number of (round r,
 * query code c) pairs where c, a code of the KV head's group of query rows in round r, equals the
 * token's key's code in round r; 0 for the tokens below pos_min. A vector's code in round r has
 * bit b set when its dot with plane r * bits + b is >= 0, the dot the floats of a plain loop in
 * element order (each product rounded, then added; the key's halves widened exactly):
 * kernels/lsh_kernels.h. Integers after the dots, so every backend gives the same hits (all 0 with
 * no query rows). The query rows are read on the host. codes is the caller's room for the query codes, [n_kv][rounds][n_q *
 * group]; the op leaves each (head, round)'s sorted. table names the page list for a device
 * backend, as be_mass's (the same list under the same name sends nothing). */
typedef struct be_lsh {
    const float *q;            /* row t's query head h at q + t * q_stride + h * head_dim */
    int64_t n_q, q_stride;
    int first_head, group, head_dim;
    const float *planes_t;     /* [head_dim][rounds * bits]: plane p's element i at i * rounds * bits + p */
    int rounds, bits;          /* rounds <= LSH_MAX_ROUNDS, bits <= LSH_MAX_BITS, head_dim <= LSH_MAX_D */
    const be_kv_page *pages;
    int64_t n_pages;
    int n_kv;                  /* KV heads (0 or 1: one, every page its) */
    const int64_t *head_pages; /* [n_kv + 1] when n_kv > 1 */
    int64_t pos_min;
    uint32_t *codes;
    int32_t *hits;             /* [the pages' tokens] */
    uint64_t table;
} be_lsh;

/* Chelsea's soft matching, one pass (engine/policy/chelsea.c): key rows [m0, m1) of k (row r at
 * k + r * dim, f32) cut into chunks of `chunk` rows from m0, the last cut short at m1; in each
 * chunk every row at an even offset (set A) is linked to the row at an odd offset (set B) of the
 * largest cosine, the first of equal ones (a NaN never chosen). best[a - m0] gets A row a's
 * partner and sim[a - m0] their cosine (-1 and -2 when its chunk has no B row); the entries of B
 * rows are left as they are. A cosine is (float)(d / sqrt(na * nb)), 0 where a norm is 0, with the
 * dot d and the squared norms na, nb summed in double in element order, the floats of a plain loop
 * on every backend. Keys, best and sim on the host. */
typedef struct be_links {
    const float *k;
    int64_t dim, m0, m1, chunk;
    int64_t *best;             /* [m1 - m0] */
    float *sim;                /* [m1 - m0] */
} be_links;

/* A link of Chelsea's soft matching: A row a to merge into B row b, their cosine. */
typedef struct be_link {
    int64_t a, b;
    float sim;
} be_link;

/* One KV head's rows for a merge: keys and values [n][dim] (f32), positions, degrees (the original
 * tokens a row stands for). n rows in; the rows kept, compacted in place, out. */
typedef struct be_merge_head {
    float *k, *v;
    int32_t *pos;
    float *deg;
    int64_t n;
} be_merge_head;

/* Chelsea's merge of some KV heads of a layer to `target` rows each (kernels/merge_kernels.h
 * defines it): with replay, each head's rows taken in arrival order and merged back to target each
 * time more than target + gap have arrived, then to target; else merged to target at once. The
 * rows stay aside in each pass's `sinks` first and `recent` last, and the middle is matched in
 * chunks of `chunk` rows. Every backend gives the same rows, bit for bit. on_pass, when given, is
 * called on the host after each pass with the head, the pass's number within its merge (from 1),
 * its links in order (the first r merged), the merged A rows (gone[t] != 0) and the positions of
 * the pass's T rows: the trace (a backend given it merges on the host). */
#define BE_MERGE_MAX_HEADS 64   /* heads a merge call takes at most */
typedef struct be_merge {
    be_merge_head *heads;    /* n_heads <= BE_MERGE_MAX_HEADS */
    int n_heads;
    int64_t dim, target, gap;
    int sinks, recent, chunk;
    int replay;
    void (*on_pass)(void *ctx, int head, int pass, const be_link *links, int64_t nl, int64_t r, const char *gone,
                    const int32_t *pos, int64_t T);
    void *ctx;
} be_merge;

typedef struct be_backend be_backend;

typedef struct be_ops {
    const char *name;
    /* Several products sharing the input x[n_tok][n_in] (e.g. Q, K and V), in one parallel pass. */
    void (*matmul)(be_backend *b, const be_mm *mms, int n_mm, const float *x, int64_t n_tok);
    /* y = x / sqrt(mean(x^2) + eps) * w, row by row; y may equal x. */
    void (*rmsnorm)(be_backend *b, const float *x, const float *w, float *y, int64_t rows, int64_t dim,
                    float eps);
    /* q and k normalized, rotated and q scaled (be_qk above). */
    void (*qk_rope)(be_backend *b, const be_qk *r);
    /* gate[i] = act(gate[i]) * up[i]; act = gelu (tanh form) or silu. */
    void (*glu)(be_backend *b, float *gate, const float *up, int64_t n, int gelu);
    /* out[t] = dequantized row ids[t] of w, times scale. */
    void (*get_rows)(be_backend *b, const be_weight *w, const int32_t *ids, int64_t n, float scale, float *out);
    void (*attention)(be_backend *b, const be_attn *a);
    /* y[r] = dot(m row r, x) for rows r < n_rows of an f32 matrix [n_rows][dim]: the selection
     * policies score every page summary against an anchor or query with one product. */
    void (*scores)(be_backend *b, const float *m, int64_t n_rows, int64_t dim, const float *x, float *y);
    /* The selection policies' page scoring (be_bounds above): every KV head's bounds and, with
     * r->k > 0, each head's best, in one call. The answers are on the host when this returns. */
    void (*bound_pages)(be_backend *b, be_bounds *r);
    /* Copy the weights a model will multiply to the device now, so running out of device memory is
     * an error at load time naming what was needed (NULL: nothing to do). 0, or -1 with a message. */
    int (*prepare)(be_backend *b, const be_weight *const *w, int n, char *err, size_t errlen);
    /* Device memory: what this backend holds and the device's total (NULL: host memory only). */
    void (*memory)(be_backend *b, uint64_t *held, uint64_t *total);
    void (*destroy)(be_backend *b);
    /* The residual connection and the next block's norm, row by row over rows rows of dim: with
     * post given, o = rmsnorm(o) * post first (in place; Gemma's norm after a block), then x += o,
     * then with w given h = rmsnorm(x) * w (h may not overlap x or o): the floats of rmsnorm, an
     * add and rmsnorm in that order. */
    void (*add_norm)(be_backend *b, float *x, float *o, const float *post, const float *w, float *h, int64_t rows,
                     int64_t dim, float eps);
    /* Residency (see the top of this file; NULL: the host copy is the only one). bind: 0, or -1 with
     * a message naming what was needed. */
    int (*bind)(be_backend *b, void *host, size_t bytes, char *err, size_t errlen);
    void (*unbind)(be_backend *b, void *host);
    void (*host_read)(be_backend *b, const be_range *r, int n);
    void (*host_write)(be_backend *b, void *p, size_t bytes);
    /* The ops have no error return. A device backend whose op fails (out of device memory, a device
     * error) records the first message, skips work until it is asked, and answers here: 1 with the
     * message (and the record cleared), or 0. The caller then discards what the ops since its last
     * question produced. NULL: ops cannot fail. */
    int (*failed)(be_backend *b, char *err, size_t errlen);
    /* A device backend's traffic so far: waits for the device and bytes copied each way (NULL: none). */
    void (*counters)(be_backend *b, uint64_t *waits, uint64_t *bytes_up, uint64_t *bytes_down);
    /* The best candidates of each of n rows of logits, a be_pick each (above; the answers are on
     * the host when this returns: a device waits once for all of them). NULL: the caller reads the
     * rows and chooses itself. */
    void (*pick)(be_backend *b, be_pick *p, int n);
    /* The host will read these ranges after the device's next wait: their newer bytes are copied
     * back now without waiting, so that the wait some op makes anyway (a pick's) brings them in and
     * the be_host_read after it waits for nothing. NULL: nothing to do ahead. */
    void (*host_prefetch)(be_backend *b, const be_range *r, int n);
    /* Wait until every op issued so far has finished on the device (the profiler's sync mode,
     * kernels/op_profile.h). NULL: an op has finished when it returns. */
    void (*finish)(be_backend *b);
    /* CHESS's summary rows and anchor (be_key_means above). */
    void (*key_means)(be_backend *b, const be_key_means *m);
    /* As bind, for a buffer whose bytes mean nothing until ops write them (rows that only ops
     * compute: the forward pass's activations, CHESS's rows): nothing is sent at its first use, nor
     * the rest of it when an op first writes part of it. pin: page-lock its host copy (the host
     * reads large parts of it, and the copies back overlap the device's work only from locked
     * memory); 0: the host touches a little of it now and then (CHESS's). NULL: bind. */
    int (*bind_blank)(be_backend *b, void *host, size_t bytes, int pin, char *err, size_t errlen);
    /* The eviction policies' attention mass (be_mass above), read from host pages; the answer is on
     * the host when this returns, computed even after a device op failed (a policy evicts by it). */
    void (*attn_mass)(be_backend *b, const be_mass *m);
    /* n attention calls at once, as a[0], ..., a[n - 1] one after another would give (a batch's
     * decode step: each sequence's call, its one query, list and rows). A device backend runs
     * calls that be_attn_seqs_joined accepts in one launch, every output the bits its call alone
     * gives. NULL: the caller makes the calls one by one (be_attention_seqs). */
    void (*attention_seqs)(be_backend *b, const be_attn *a, int n);
    /* The host threads this backend computes with (a CPU backend's own, a device backend's CPU
     * backend's), lent to host work the engine spreads between ops (be_host_run): idle then.
     * NULL: none. */
    struct tp_pool *(*host_pool)(be_backend *b);
    /* Rows the cache has just taken from bound buffers (be_page_rows above): a device backend
     * writes them into its copies of the pages from its twins instead of sending the host's rows
     * at the next call that reads the pages. NULL: they are sent then. */
    void (*page_rows)(be_backend *b, const be_page_rows *r, int n);
    /* An eviction's fresh pages, filled on the host from rows of pages the cache still holds
     * (be_page_move above): a device backend builds its copies of them from its copies of those
     * pages instead of receiving the fresh pages whole at the next call that reads them. NULL: they
     * are sent then. */
    void (*page_moves)(be_backend *b, const be_page_move *m, int n);
    /* LASER-KV's SimHash recall (be_lsh above); the answer is on the host when this returns,
     * computed even after a device op failed (a policy evicts by it). NULL: the host's threads
     * compute it (be_lsh_hits). */
    void (*lsh_hits)(be_backend *b, const be_lsh *l);
    /* Chelsea's soft matching (be_links above), on the host when this returns. NULL: the host's
     * threads compute it (be_soft_links). */
    void (*soft_links)(be_backend *b, const be_links *l);
    /* Chelsea's merge of a layer's KV heads (be_merge above), on the host's arrays when this
     * returns: 0, or -1 when memory ran out (the heads' rows are then not to be used). NULL: the
     * host's threads merge (be_merge_heads). */
    int (*merge_heads)(be_backend *b, const be_merge *m);
    /* Page lists the next calls under their names will read (a[i]'s table, shape, from_table,
     * pages, n_pages, head_pages and n_head_kv; nothing else is read): a device backend brings its
     * copies of the pages up to date and keeps each list's descriptors under its name now, without
     * waiting, so that the next call under the name sends only what changed since (a restored
     * snapshot's cache goes to the device when it is restored, not with the first question).
     * Device memory found short is not an error here (the call that reads the pages says it).
     * NULL: nothing to do. */
    void (*place_pages)(be_backend *b, const be_attn *a, int n);
    /* As place_pages for a selection's summaries: r's table, shape, n_head_kv, dim, sum and off (as
     * bound_pages reads them; nothing else is read) kept on the device under r's name now, without
     * waiting, so that the next bound_pages under the name sends only what changed since. NULL:
     * nothing to do. */
    void (*place_bounds)(be_backend *b, const be_bounds *r);
    /* A model's constant vectors, the weights its norms are given (rmsnorm's w, add_norm's post and
     * w, be_qk's q_norm and k_norm): unchanged at these addresses for the life of the backend, as a
     * be_weight's bytes. A device backend copies them now and uses its copy of one without looking
     * at the host's bytes again; any other address given to those ops is compared with its copy at
     * every call. NULL: nothing to do. */
    void (*constants)(be_backend *b, const be_range *r, int n);
} be_ops;

struct be_backend {
    const be_ops *ops;
    int n_threads;
    void *impl;
};

/* CPU backend with n_threads threads (<= 0: all cores). NULL and a message on failure. */
be_backend *be_cpu_create(int n_threads, char *err, size_t errlen);
/* The CPU backend's worker threads, for a device backend's host-side work (converting weights). */
struct tp_pool *be_cpu_pool(be_backend *cpu);
/* CUDA backend on device 0; the small element-wise ops run on a CPU backend of n_threads threads.
 * NULL and a message when kvchat was built without CUDA, no device is present, or setting up fails. */
be_backend *be_cuda_create(int n_threads, char *err, size_t errlen);
/* The GPU a CUDA backend runs on (device 0 of those CUDA_VISIBLE_DEVICES leaves): its name (bytes
 * outside printable ASCII shown as '?'), how many devices there are, its compute capability and its
 * memory. 0 when it can run; else why not: -1 when there is none (a build without CUDA, no driver,
 * no device), -2 when there is one it cannot use (the driver older than the runtime, a compute
 * capability the build has no code for; name and capability filled where known). */
typedef struct be_gpu {
    char name[256];
    int count, cc_major, cc_minor;
    uint64_t total, free;        /* bytes */
} be_gpu;
int be_cuda_gpu(be_gpu *g, char *why, size_t whylen);
/* Attention calls a CUDA backend ran on its tensor-core flash kernel (prefill chunks, unless
 * KVCHAT_CUDA_ATTN says grouped or scalar; tests and benchmarks check that it ran); 0 for any other
 * backend. */
uint64_t be_cuda_flash_calls(be_backend *b);
/* Calls into the CUDA runtime and cuBLAS a CUDA backend has made and checked (kernel launches,
 * copies, waits: each a few microseconds of the host's time, what bounds a small model's decode
 * step); the op profiler reports them an op. 0 for any other backend. */
uint64_t be_cuda_runtime_calls(be_backend *b);
/* Upload batches a CUDA backend sent in its scatter launch's parameters instead of a copy
 * (kernels/upload_batch.h, ub_inline_size; none under KVCHAT_CUDA_INLINE=off). 0 for any other
 * backend. */
uint64_t be_cuda_inline_sends(be_backend *b);
/* A piece of be_cuda_test_batch: bytes [from, from + len) of the source (dev: of the buffer's own
 * device bytes, copied on the device) to bytes [at, at + len) of the buffer. */
typedef struct be_test_piece {
    size_t at, from, len;
    int dev;
} be_test_piece;
/* For tests: the pieces queued for the device bytes of host buffer dst (bound, `bytes` long) and
 * sent as one upload batch, as an attention call sends its own (the host reads them back with
 * be_host_read). The parameter size the batch rode in (ub_inline_size), 0 when it was copied, -1
 * when not sent (not a CUDA backend, dst not bound, out of memory). */
int64_t be_cuda_test_batch(be_backend *b, void *dst, size_t bytes, const void *src, const be_test_piece *p, int n);
/* The KVCHAT_CUDA_* settings a CUDA backend was made with that are not its defaults, as
 * "NAME=value, ..." ("" when none, and for any other backend): benchmarks and the device's name
 * say them, so figures taken under them are told apart. */
void be_cuda_settings(be_backend *b, char *buf, size_t cap);
/* A CUDA backend's recorded decode work (KVCHAT_CUDA_GRAPH=on, kernels/step_graphs.h): segments
 * run as graphs, the calls they recorded, how many ran by updating a kept graph and how many built
 * one (of which `refused`: an update the device refused), device failures, whether recording is on
 * and whether it gave up (shapes changing too often). All 0 for any other backend. */
typedef struct be_graph_stats {
    uint64_t segments, calls, updates, builds, refused, failures;
    int on, gave_up;
} be_graph_stats;
void be_cuda_graphs(be_backend *b, be_graph_stats *st);
/* Times a CUDA backend's products rounded their input to 8-bit codes themselves (quantize_act),
 * rather than reading the codes the op that wrote the input left (tests check which happened); 0
 * for any other backend. */
uint64_t be_cuda_input_quantizations(be_backend *b);
/* Rows of KV pages a CUDA backend has, so far, written into its page copies from the rows it
 * computed (be_ops.page_rows), copied between its page copies for an eviction's fresh pages
 * (be_ops.page_moves), and sent up from the host's pages; all 0 for any other backend. */
void be_cuda_page_rows(be_backend *b, uint64_t *written, uint64_t *moved, uint64_t *uploaded);
/* Page descriptors a CUDA backend has, so far, copied on the device into a fork's lists from its
 * source's (be_attn.from_table) instead of building and sending them; 0 for any other backend. */
uint64_t be_cuda_cloned_entries(be_backend *b);
/* Of the selection policies' summaries a CUDA backend has put on the device so far (each new or
 * changed one, be_ops.bound_pages and place_bounds), those it folded from its copies of the pages
 * (be_summary.k) and those sent from the host; both 0 for any other backend. */
void be_cuda_summaries(be_backend *b, uint64_t *folded, uint64_t *sent);
/* A CUDA backend's warm-up (be_warming_up) is over: the page lists and page copies its throwaway
 * cache left are freed now, their blocks back in the pool for the run's pages, instead of after
 * thousands of idle calls. Nothing for any other backend. */
void be_cuda_warmed_up(be_backend *b);
void be_free(be_backend *b);
/* As be_free, for a backend given up before the run (the GPU --device auto leaves): the op
 * profiler's report, if one stands in front of it, is not written (the run's is the backend's that
 * replaces it). */
void be_discard(be_backend *b);
/* The device a run asks for: AUTO is the GPU when one that can run is present (be_cuda_gpu), and
 * the run decides it (engine/run.c, which falls back to the CPU); be_create makes a CUDA backend
 * for CUDA and a CPU one otherwise. */
enum { BE_DEVICE_AUTO, BE_DEVICE_CPU, BE_DEVICE_CUDA };
be_backend *be_create(int device, int n_threads, char *err, size_t errlen);
/* The weights a model multiplies, prepared on b (a device copies them now); note gets what a front
 * end should say once (the types a GPU converts to f16, "" none). 0, or -1 with a message. */
int be_prepare_weights(be_backend *b, const be_weight *const *w, int n, char *note, size_t note_cap, char *err,
                       size_t errlen);
/* The ops between be_warming_up(b, 1) and be_warming_up(b, 0) belong to loading: a throwaway
 * sequence that pays a device's one-off costs before the first prompt (engine/run.c), freed
 * before be_warming_up(b, 0). The op profiler reports them apart from the run's; at the end a CUDA
 * backend lets go of what the sequence left on the device (be_cuda_warmed_up). */
void be_warming_up(be_backend *b, int on);
/* The CPU kernels' instruction set: by name (NULL: the best this CPU has; $KVCHAT_ISA is checked
 * too) or none (no_simd); the name of the one in use; what is in use and what the CPU supports. */
int be_cpu_set_kernels(const char *isa, int no_simd, char *err, size_t errlen);
const char *be_cpu_kernels(void);
void be_cpu_kernels_summary(char *buf, size_t cap);
/* The threads a CPU backend asked for n_threads runs (<= 0: all cores). */
int be_cpu_threads(int n_threads);
/* The host CPU's model name (from /proc/cpuinfo; "unknown cpu" where it gives none). */
void be_cpu_model(char *buf, size_t cap);
/* What runs b's ops, in a few words for people: the GPU's name ("NVIDIA H200") for a device
 * backend, with the settings it runs under that are not its defaults in brackets
 * ("NVIDIA H200 (KVCHAT_CUDA_GRAPH=on)", be_cuda_settings), else "CPU (2 threads)". */
void be_describe(be_backend *b, char *buf, size_t cap);
/* Residency through the op table, doing nothing where the backend has none. */
static inline int be_bind(be_backend *b, void *host, size_t bytes, char *err, size_t errlen)
{
    return b->ops->bind ? b->ops->bind(b, host, bytes, err, errlen) : 0;
}
static inline int be_bind_blank(be_backend *b, void *host, size_t bytes, int pin, char *err, size_t errlen)
{
    return b->ops->bind_blank ? b->ops->bind_blank(b, host, bytes, pin, err, errlen)
                              : be_bind(b, host, bytes, err, errlen);
}
static inline void be_unbind(be_backend *b, void *host)
{
    if (b->ops->unbind) b->ops->unbind(b, host);
}
static inline void be_host_read(be_backend *b, const be_range *r, int n)
{
    if (b->ops->host_read) b->ops->host_read(b, r, n);
}
static inline void be_host_prefetch(be_backend *b, const be_range *r, int n)
{
    if (b->ops->host_prefetch) b->ops->host_prefetch(b, r, n);
}
static inline void be_host_write(be_backend *b, void *p, size_t bytes)
{
    if (b->ops->host_write) b->ops->host_write(b, p, bytes);
}
static inline void be_attention_seqs(be_backend *b, const be_attn *a, int n)
{
    if (b->ops->attention_seqs) {
        b->ops->attention_seqs(b, a, n);
        return;
    }
    for (int i = 0; i < n; i++) b->ops->attention(b, &a[i]);
}
static inline void be_place_pages(be_backend *b, const be_attn *a, int n)
{
    if (b->ops->place_pages) b->ops->place_pages(b, a, n);
}
static inline void be_place_bounds(be_backend *b, const be_bounds *r)
{
    if (b->ops->place_bounds) b->ops->place_bounds(b, r);
}
static inline void be_constants(be_backend *b, const be_range *r, int n)
{
    if (b->ops->constants) b->ops->constants(b, r, n);
}
static inline int be_failed(be_backend *b, char *err, size_t errlen)
{
    return b->ops->failed ? b->ops->failed(b, err, errlen) : 0;
}
/* be_lsh on the host over b's host threads (be_host_run; b may be NULL): what a backend without
 * its own lsh_hits gives. */
void be_host_lsh_hits(be_backend *b, const be_lsh *l);
/* Its first part alone: l->codes filled with the query rows' codes, each (head, round) sorted
 * (a device backend codes the queries on the host and the keys where the pages are). */
void be_host_lsh_query_codes(be_backend *b, const be_lsh *l);
static inline void be_lsh_hits(be_backend *b, const be_lsh *l)
{
    if (b->ops->lsh_hits) b->ops->lsh_hits(b, l);
    else be_host_lsh_hits(b, l);
}
/* be_links on the host over b's host threads (b may be NULL: the calling thread): what a backend
 * without its own soft_links gives (kernels/cpu/soft_links.c). */
void be_host_soft_links(be_backend *b, const be_links *l);
static inline void be_soft_links(be_backend *b, const be_links *l)
{
    if (b && b->ops->soft_links) b->ops->soft_links(b, l);
    else be_host_soft_links(b, l);
}
/* be_merge on the host, each pass's links by be_soft_links on b (b may be NULL: the calling
 * thread): what a backend without its own merge_heads gives (kernels/cpu/merge_heads.c). */
int be_host_merge_heads(be_backend *b, const be_merge *m);
static inline int be_merge_heads(be_backend *b, const be_merge *m)
{
    if (b && b->ops->merge_heads) return b->ops->merge_heads(b, m);
    return be_host_merge_heads(b, m);
}
/* Rows not in the cache yet (a->n_cur > 0: a deferred decode step's, or a prefill chunk's) as more
 * pages per KV head after that head's pages, the order the cache would give them, BE_CUR_ROWS rows a
 * page (so that a kernel skips the pages past a query, and splits over pages stay even):
 * out[0 .. be_attn_rows_len(a)) gets per-head lists (hp[0 .. n_head_kv] their offsets; a shared list
 * is repeated per head) whose extra entries point into k16/v16 ([n_cur][n_head_kv * head_dim] f16,
 * all heads side by side) and pos. Returns the count. */
#define BE_CUR_ROWS 32
int64_t be_attn_rows_len(const be_attn *a);
int64_t be_attn_rows_list(const be_attn *a, const uint16_t *k16, const uint16_t *v16, const int32_t *pos,
                          be_kv_page *out, int64_t *hp);
/* The same in two steps, for a caller that needs only each head's last entries written: the
 * offsets (hp, as be_attn_rows_list gives them; returns the count), then the entries, head g's
 * from index from[g] on (from NULL: every entry; those before it are left as they are). */
int64_t be_attn_rows_heads(const be_attn *a, int64_t *hp);
void be_attn_rows_fill(const be_attn *a, const uint16_t *k16, const uint16_t *v16, const int32_t *pos,
                       be_kv_page *out, const int64_t *hp, const int64_t *from);
/* The most calls one joined attention launch serves (a batch's sequences, FWD_BATCH_MAX). */
#define BE_ATTN_SEQS_MAX 8
/* 1 when calls a[0 .. n) can run as one launch: 2 <= n <= BE_ATTN_SEQS_MAX, each one query with
 * the same heads, head dimension and window, a list of its own (head_pages given) under a name no
 * other call gives (be_attn.table: a device keeps one list a name until the launch), and its rows
 * laid out as one call's of n queries would be: q, out, q_pos, and with rows not in the cache (one
 * each, or none in every call) cur_k, cur_v, cur_pos, call i's at i rows from call 0's. 0
 * otherwise (then one launch a call). */
int be_attn_seqs_joined(const be_attn *a, int n);
/* A selection (a->sel_best, read on the host) as the explicit list it stands for: per KV head the
 * chosen entries of a->pages, then the head's entries from sel_from on, into
 * out[0 .. be_attn_sel_len(a)) with offsets hp[0 .. n_head_kv] (ag_sel_at, kernels/attn_group.h,
 * maps each entry, here and on the device). Returns the count. */
int64_t be_attn_sel_len(const be_attn *a);
int64_t be_attn_sel_list(const be_attn *a, be_kv_page *out, int64_t *hp);
/* A choice of tokens (a->sel_bits, read on the host) as the explicit list it stands for: per KV
 * head its entries with a chosen token, each with a token mask (in masks, be_attn_bits_words(a)
 * words in all) where not every token is chosen, into out[0 .. a->n_pages) with offsets
 * hp[0 .. n_head_kv]; the entries written. */
int64_t be_attn_bits_words(const be_attn *a);
int64_t be_attn_bits_list(const be_attn *a, be_kv_page *out, uint64_t *masks, int64_t *hp);
/* fn(ctx, task, thread) for every task in [0, n), spread over b's host threads (be_ops.host_pool;
 * thread in [0, their count)), in any order; one after another on the calling thread (thread 0)
 * where b has none or b is NULL. Returns when every task is done. The caller calls it between ops. */
typedef void (*be_task_fn)(void *ctx, int64_t task, int thread);
void be_host_run(be_backend *b, be_task_fn fn, void *ctx, int64_t n);
/* Rows the engine keeps on the host in f16 (its KV cache, a policy's scoring of cached keys): the
 * CPU's kernels, whichever backend runs the model. f32 -> f16 rounds to nearest even. */
void be_host_f32_to_f16(int64_t n, const float *x, uint16_t *y);
/* A page's key summary folded with one f16 key row (per element: sum += k, min and max by k < min
 * and k > max, so NaN changes neither bound). */
void be_host_key_summary(int64_t n, const uint16_t *k, float *sum, float *mn, float *mx);
/* The same for rows key rows k, k + stride, ... folded in order (the same floats, faster). */
void be_host_key_summary_rows(int64_t n, int64_t rows, const uint16_t *k, int64_t stride, float *sum, float *mn,
                              float *mx);
float be_host_dot_f32_f16(int64_t n, const float *a, const uint16_t *b);
/* The bits set in now[0 .. words) (*set), of them those set in last too (*shared), and now copied
 * into last, in one pass (a selection's reuse from one step to the next). */
void be_host_bits_overlap(int64_t words, const uint64_t *now, uint64_t *last, int64_t *set, int64_t *shared);
/* 1 if this backend can multiply weights of this type. */
int be_supports_weight(const be_backend *b, uint32_t type);
/* How the CUDA backend holds a weight type, in either build (kernels/gpu_weights.c): 1 when its
 * kernels read the file's bytes as they are (Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16), 0 when
 * it converts the weight to f16 at load. For a weight of rows of n_in values: the type its device
 * copy has (the file's, or F16 when converted; BF16 rows that are not whole groups of 32 are
 * converted too), the bytes a row takes on the device (padded to 16), and the bytes of n_out rows. */
int be_gpu_reads_as_stored(uint32_t type);
uint32_t be_gpu_weight_type(uint32_t type, int64_t n_in);
uint64_t be_gpu_weight_stride(uint32_t type, int64_t n_in);
uint64_t be_gpu_weight_bytes(uint32_t type, int64_t n_in, int64_t n_out);

#endif
