/* op_profile.c - a backend in front of another that times its ops (op_profile.h). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/op_profile.h"

enum {
    R_MATMUL_1, R_MATMUL_N, R_RMSNORM, R_QK_ROPE, R_GLU, R_GET_ROWS, R_ATTENTION_1, R_ATTENTION_N,
    R_ATTENTION_SEQS, R_SCORES, R_BOUND_PAGES, R_ADD_NORM, R_PREPARE, R_BIND, R_UNBIND, R_HOST_READ,
    R_HOST_WRITE, R_PICK, R_HOST_PREFETCH, R_KEY_MEANS, R_ATTN_MASS, R_PAGE_ROWS, R_PAGE_MOVES, R_LSH_HITS,
    R_SOFT_LINKS, R_MERGE_HEADS, R_PLACE_PAGES, R_PLACE_BOUNDS, R_WARM_UP, R_N
};

static const char *const row_name[R_N] = {
    "matmul 1 token", "matmul tokens", "rmsnorm", "qk_rope", "glu", "get_rows", "attention 1 query",
    "attention queries", "attention joined", "scores", "bound_pages", "add_norm", "prepare", "bind", "unbind",
    "host_read", "host_write", "pick", "host_prefetch", "key_means", "attn_mass", "page_rows", "page_moves",
    "lsh_hits", "soft_links", "merge_heads", "place_pages", "place_bounds", "warm-up",
};

typedef struct prof_row {
    long calls;
    double s, max;                 /* seconds inside the op: all calls, the longest call */
    uint64_t waits, up, down;      /* the device traffic it caused */
    uint64_t rt;                   /* calls into the CUDA runtime it made (be_cuda_runtime_calls) */
} prof_row;

typedef struct prof {
    be_backend outer;
    be_backend *inner;
    be_ops ops;                    /* inner's, each op replaced by its timed twin */
    int mode;
    FILE *report;
    prof_row rows[R_N];
    double first, last;            /* the window: first op's start, last op's end (0: none yet), */
    double in_ops;                 /* and the seconds inside ops in it; prepare (load time) is outside */
    int warming;                   /* the ops are loading's warm-up (op_profile_set_warming_up) */
} prof;

typedef struct mark {
    double t;
    uint64_t waits, up, down, rt;
} mark;

static prof *prof_of(be_backend *b) { return (prof *)b->impl; }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void traffic(prof *p, mark *m)
{
    m->waits = m->up = m->down = 0;
    if (p->inner->ops->counters) p->inner->ops->counters(p->inner, &m->waits, &m->up, &m->down);
    m->rt = be_cuda_runtime_calls(p->inner);
}

/* Load time (the weights' upload, the warm-up): rows outside the window. */
static int at_load(int row) { return row == R_PREPARE || row == R_WARM_UP; }

static mark begin(prof *p, int row)
{
    mark m;
    traffic(p, &m);
    m.t = now_s();
    if (p->first == 0 && !at_load(row)) p->first = m.t;
    return m;
}

static void end(prof *p, int row, const mark *m)
{
    if (p->mode == OP_PROFILE_SYNC && p->inner->ops->finish) p->inner->ops->finish(p->inner);
    double t = now_s();
    mark e;
    traffic(p, &e);
    prof_row *r = &p->rows[row];
    r->calls++;
    r->s += t - m->t;
    if (t - m->t > r->max) r->max = t - m->t;
    r->waits += e.waits - m->waits;
    r->up += e.up - m->up;
    r->down += e.down - m->down;
    r->rt += e.rt - m->rt;
    if (at_load(row)) return;
    p->in_ops += t - m->t;
    p->last = t;
}

/* One timed twin: `call` runs inner's op with the same arguments; `row` picks the report's row. */
#define TIMED(row, call)                                                                                   \
    do {                                                                                                   \
        prof *p_ = prof_of(b);                                                                             \
        be_backend *in_ = p_->inner;                                                                       \
        const int row_ = p_->warming ? R_WARM_UP : (row);                                                  \
        mark m_ = begin(p_, row_);                                                                         \
        call;                                                                                              \
        end(p_, row_, &m_);                                                                                \
    } while (0)

static void t_matmul(be_backend *b, const be_mm *mms, int n_mm, const float *x, int64_t n_tok)
{
    TIMED(n_tok == 1 ? R_MATMUL_1 : R_MATMUL_N, in_->ops->matmul(in_, mms, n_mm, x, n_tok));
}

static void t_rmsnorm(be_backend *b, const float *x, const float *w, float *y, int64_t rows, int64_t dim, float eps)
{
    TIMED(R_RMSNORM, in_->ops->rmsnorm(in_, x, w, y, rows, dim, eps));
}

static void t_qk_rope(be_backend *b, const be_qk *r) { TIMED(R_QK_ROPE, in_->ops->qk_rope(in_, r)); }

static void t_glu(be_backend *b, float *gate, const float *up, int64_t n, int gelu)
{
    TIMED(R_GLU, in_->ops->glu(in_, gate, up, n, gelu));
}

static void t_get_rows(be_backend *b, const be_weight *w, const int32_t *ids, int64_t n, float scale, float *out)
{
    TIMED(R_GET_ROWS, in_->ops->get_rows(in_, w, ids, n, scale, out));
}

static void t_attention(be_backend *b, const be_attn *a)
{
    TIMED(a->n_q == 1 ? R_ATTENTION_1 : R_ATTENTION_N, in_->ops->attention(in_, a));
}

/* A batch's calls at once: a row of their own (one call however many sequences; one sequence's
 * counts as attention's). */
static void t_attention_seqs(be_backend *b, const be_attn *a, int n)
{
    TIMED(n > 1 ? R_ATTENTION_SEQS : a->n_q == 1 ? R_ATTENTION_1 : R_ATTENTION_N,
          in_->ops->attention_seqs(in_, a, n));
}

static void t_scores(be_backend *b, const float *m, int64_t n_rows, int64_t dim, const float *x, float *y)
{
    TIMED(R_SCORES, in_->ops->scores(in_, m, n_rows, dim, x, y));
}

static void t_bound_pages(be_backend *b, be_bounds *r) { TIMED(R_BOUND_PAGES, in_->ops->bound_pages(in_, r)); }

static int t_prepare(be_backend *b, const be_weight *const *w, int n, char *err, size_t errlen)
{
    int rc = 0;
    TIMED(R_PREPARE, rc = in_->ops->prepare(in_, w, n, err, errlen));
    return rc;
}

static void t_memory(be_backend *b, uint64_t *held, uint64_t *total)
{
    be_backend *in = prof_of(b)->inner;
    in->ops->memory(in, held, total);
}

static void t_add_norm(be_backend *b, float *x, float *o, const float *post, const float *w, float *h, int64_t rows,
                       int64_t dim, float eps)
{
    TIMED(R_ADD_NORM, in_->ops->add_norm(in_, x, o, post, w, h, rows, dim, eps));
}

static int t_bind(be_backend *b, void *host, size_t bytes, char *err, size_t errlen)
{
    int rc = 0;
    TIMED(R_BIND, rc = in_->ops->bind(in_, host, bytes, err, errlen));
    return rc;
}

static int t_bind_blank(be_backend *b, void *host, size_t bytes, int pin, char *err, size_t errlen)
{
    int rc = 0;
    TIMED(R_BIND, rc = in_->ops->bind_blank(in_, host, bytes, pin, err, errlen));
    return rc;
}

static void t_unbind(be_backend *b, void *host) { TIMED(R_UNBIND, in_->ops->unbind(in_, host)); }

static void t_host_read(be_backend *b, const be_range *r, int n) { TIMED(R_HOST_READ, in_->ops->host_read(in_, r, n)); }

static void t_host_write(be_backend *b, void *ptr, size_t bytes)
{
    TIMED(R_HOST_WRITE, in_->ops->host_write(in_, ptr, bytes));
}

static int t_failed(be_backend *b, char *err, size_t errlen)
{
    be_backend *in = prof_of(b)->inner;
    return in->ops->failed(in, err, errlen);
}

static void t_counters(be_backend *b, uint64_t *waits, uint64_t *bytes_up, uint64_t *bytes_down)
{
    be_backend *in = prof_of(b)->inner;
    in->ops->counters(in, waits, bytes_up, bytes_down);
}

/* Lent threads, not an op: the engine's work on them counts as time between ops. */
static struct tp_pool *t_host_pool(be_backend *b)
{
    be_backend *in = prof_of(b)->inner;
    return in->ops->host_pool(in);
}

static void t_pick(be_backend *b, be_pick *pk, int n) { TIMED(R_PICK, in_->ops->pick(in_, pk, n)); }

static void t_host_prefetch(be_backend *b, const be_range *r, int n)
{
    TIMED(R_HOST_PREFETCH, in_->ops->host_prefetch(in_, r, n));
}

static void t_key_means(be_backend *b, const be_key_means *m) { TIMED(R_KEY_MEANS, in_->ops->key_means(in_, m)); }
static void t_attn_mass(be_backend *b, const be_mass *m) { TIMED(R_ATTN_MASS, in_->ops->attn_mass(in_, m)); }
static void t_page_rows(be_backend *b, const be_page_rows *r, int n)
{
    TIMED(R_PAGE_ROWS, in_->ops->page_rows(in_, r, n));
}
static void t_page_moves(be_backend *b, const be_page_move *m, int n)
{
    TIMED(R_PAGE_MOVES, in_->ops->page_moves(in_, m, n));
}
static void t_lsh_hits(be_backend *b, const be_lsh *l) { TIMED(R_LSH_HITS, in_->ops->lsh_hits(in_, l)); }
static void t_soft_links(be_backend *b, const be_links *l) { TIMED(R_SOFT_LINKS, in_->ops->soft_links(in_, l)); }
static int t_merge_heads(be_backend *b, const be_merge *m)
{
    int rc;
    TIMED(R_MERGE_HEADS, rc = in_->ops->merge_heads(in_, m));
    return rc;
}

static void t_place_pages(be_backend *b, const be_attn *a, int n)
{
    TIMED(R_PLACE_PAGES, in_->ops->place_pages(in_, a, n));
}

static void t_place_bounds(be_backend *b, const be_bounds *r) { TIMED(R_PLACE_BOUNDS, in_->ops->place_bounds(in_, r)); }

/* load time, as prepare: outside the profile's window */
static void t_constants(be_backend *b, const be_range *r, int n)
{
    be_backend *in = prof_of(b)->inner;
    in->ops->constants(in, r, n);
}

static void t_finish(be_backend *b)
{
    be_backend *in = prof_of(b)->inner;
    in->ops->finish(in);
}

static void t_destroy(be_backend *b)
{
    prof *p = prof_of(b);
    if (p->report) op_profile_write(b, p->report);
    p->inner->ops->destroy(p->inner);
    free(p);
}

/* An op inner lacks stays absent: its absence means something to the engine (no pick: the host
 * reads the row; no bind: no residency). */
#define TWIN(op) p->ops.op = in->ops->op ? t_##op : NULL

be_backend *op_profile_wrap(be_backend *in, int mode, FILE *report)
{
    prof *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->inner = in;
    p->mode = mode == OP_PROFILE_SYNC ? OP_PROFILE_SYNC : OP_PROFILE_HOST;
    p->report = report;
    p->ops.name = in->ops->name;
    TWIN(matmul);
    TWIN(rmsnorm);
    TWIN(qk_rope);
    TWIN(glu);
    TWIN(get_rows);
    TWIN(attention);
    TWIN(scores);
    TWIN(bound_pages);
    TWIN(prepare);
    TWIN(memory);
    p->ops.destroy = t_destroy;
    TWIN(add_norm);
    TWIN(bind);
    TWIN(unbind);
    TWIN(host_read);
    TWIN(host_write);
    TWIN(failed);
    TWIN(counters);
    TWIN(pick);
    TWIN(host_prefetch);
    TWIN(finish);
    TWIN(key_means);
    TWIN(bind_blank);
    TWIN(attn_mass);
    TWIN(attention_seqs);
    TWIN(host_pool);
    TWIN(page_rows);
    TWIN(page_moves);
    TWIN(lsh_hits);
    TWIN(soft_links);
    TWIN(merge_heads);
    TWIN(place_pages);
    TWIN(place_bounds);
    TWIN(constants);
    p->outer.ops = &p->ops;
    p->outer.n_threads = in->n_threads;
    p->outer.impl = p;
    return &p->outer;
}

/* b is a backend op_profile_wrap made (its destroy is the profile's). */
static int is_profile(const be_backend *b) { return b->ops->destroy == t_destroy; }

void op_profile_set_warming_up(be_backend *b, int on)
{
    if (is_profile(b)) prof_of(b)->warming = on;
}

be_backend *op_profile_inner(be_backend *b) { return is_profile(b) ? prof_of(b)->inner : b; }

void op_profile_discard(be_backend *b)
{
    if (is_profile(b)) prof_of(b)->report = NULL;
}

int op_profile_mode_from_env(void)
{
    const char *v = getenv("KVCHAT_PROFILE");
    if (!v || !*v || !strcmp(v, "0")) return 0;
    if (!strcmp(v, "1")) return OP_PROFILE_HOST;
    if (!strcmp(v, "sync")) return OP_PROFILE_SYNC;
    return -1;
}

static int by_time(const void *a, const void *b)
{
    const prof_row *x = *(const prof_row *const *)a, *y = *(const prof_row *const *)b;
    return (x->s < y->s) - (x->s > y->s);
}

void op_profile_write(be_backend *b, FILE *f)
{
    prof *p = prof_of(b);
    double window = p->last > p->first ? p->last - p->first : 0;
    fprintf(f, "kvchat profile (%s backend, %s): %.3f s from the first op after loading to the last\n", p->ops.name,
            p->mode == OP_PROFILE_SYNC ? "each op waited for: its host and device time"
                                       : "host time in each op; an op that waits absorbs the device's backlog",
            window);
    /* a CUDA backend's calls into its runtime, an op's on average: the last column */
    int with_rt = 0;
    for (int i = 0; i < R_N; i++) with_rt |= p->rows[i].rt > 0;
    fprintf(f, "%-20s %9s %10s %9s %9s %6s %8s %9s %9s%s\n", "op", "calls", "ms", "us/call", "max us", "share",
            "waits", "MiB up", "MiB down", with_rt ? "   rt calls" : "");
    const prof_row *order[R_N];
    for (int i = 0; i < R_N; i++) order[i] = &p->rows[i];
    qsort(order, R_N, sizeof *order, by_time);
    for (int i = 0; i < R_N; i++) {
        const prof_row *r = order[i];
        if (!r->calls) continue;
        int outside = at_load((int)(r - p->rows));   /* load time: no share of the window */
        fprintf(f, "%-20s %9ld %10.3f %9.2f %9.1f %5.1f%% %8llu %9.2f %9.2f", row_name[r - p->rows], r->calls,
                1e3 * r->s, 1e6 * r->s / (double)r->calls, 1e6 * r->max, window > 0 && !outside ? 100 * r->s / window : 0,
                (unsigned long long)r->waits,
                (double)r->up / (1 << 20), (double)r->down / (1 << 20));
        if (with_rt) fprintf(f, " %10.2f", (double)r->rt / (double)r->calls);
        fputc('\n', f);
    }
    double between = window - p->in_ops;
    fprintf(f, "%-20s %9s %10.3f %9s %9s %5.1f%%\n", "between ops", "-", 1e3 * (between > 0 ? between : 0), "-", "-",
            window > 0 && between > 0 ? 100 * between / window : 0);
    be_graph_stats g;   /* a CUDA backend's recorded segments (KVCHAT_CUDA_GRAPH=on), load time included */
    be_cuda_graphs(p->inner, &g);
    if (g.segments || g.failures)
        fprintf(f, "graphs: %llu segments of %.1f calls on average, %llu run by updating a kept graph, %llu built (%llu "
                   "updates refused), %llu failures%s\n",
                (unsigned long long)g.segments, g.segments ? (double)g.calls / (double)g.segments : 0.0,
                (unsigned long long)g.updates, (unsigned long long)g.builds, (unsigned long long)g.refused,
                (unsigned long long)g.failures, g.gave_up ? "; gave up (shapes changing too often)" : "");
}

char *op_profile_text(be_backend *b)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return NULL;
    op_profile_write(b, f);
    if (fclose(f)) {
        free(text);
        return NULL;
    }
    return text;
}

long op_profile_calls(be_backend *b, const char *row, double *seconds)
{
    prof *p = prof_of(b);
    for (int i = 0; i < R_N; i++)
        if (!strcmp(row_name[i], row)) {
            if (seconds) *seconds = p->rows[i].s;
            return p->rows[i].calls;
        }
    if (seconds) *seconds = 0;
    return 0;
}
