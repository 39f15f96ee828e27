/* merge_heads.cu - the CUDA backend's Chelsea merge (be_ops.merge_heads): the heads of a call with
 * the same row count side by side (a launch's blockIdx.y), every pass planned ahead from the shape
 * (kernels/merge_kernels.h mg_plan) and run as seven launches of kernels/merge_kernels.h's steps, the
 * rows sent once and brought back once (two waits a group: the flags, then the rows). A pass whose
 * links are not those the shape gives (a NaN cosine, from infinite keys), a trace, memory short
 * for the rows or a failed device: the CPU backend merges, from the host's rows, untouched until
 * the device's are known good. */
#include "kernels/cuda/backend_cuda.cuh"
#include "kernels/merge_kernels.h"

#define MG_THREADS 256
#define MG_SCAN 1024      /* a compaction's threads: each takes a run of the rows */
#define MG_SIMS_MAX ((int64_t)1 << 28)   /* bytes of pairs' cosines a call may hold (chunks of thousands: the CPU) */
#define MG_KEEP_BYTES ((size_t)64 << 20)  /* scratch kept between calls; more is freed after the call */

/* One group's device arrays: H heads of T0 rows, head h's at h * (its per-head size). */
typedef struct mg_dev {
    float *sk, *sv, *sdeg;       /* the source rows, in arrival order */
    int32_t *spos;
    float *wk[2], *wv[2], *wdeg[2];   /* the held rows (wk[cur]) and where a pass leaves them */
    int32_t *wpos[2];
    double *nrm;
    float *sims;                 /* [H][sims_cap]: a pass's pairs' cosines, A slot j's at j * per */
    int64_t *la, *lb, *order;    /* [H][slots_cap] */
    float *ls;
    unsigned char *gone;         /* [H][T0] */
    int32_t *idx;                /* [H][T0] */
    int32_t *flag;               /* [H]: a pass's links were not the shape's */
    int64_t T0, D, slots_cap, sims_cap;
    int H, cur;
    cuda_impl *ci;
} mg_dev;

__global__ void mg_norms_kernel(const float *w, double *nrm, int64_t T0, int64_t D, int64_t m0, int64_t m1)
{
    const int64_t h = blockIdx.y, t = m0 + (int64_t)blockIdx.x * MG_THREADS + threadIdx.x;
    if (t < m1) nrm[h * T0 + t] = mg_norm(w + (h * T0 + t) * D, D);
}

__global__ void mg_pairs_kernel(mg_pass p, const float *w, const double *nrm, float *sims, int64_t T0, int64_t D,
                                int64_t scap)
{
    const int64_t h = blockIdx.y, x = (int64_t)blockIdx.x * MG_THREADS + threadIdx.x;
    if (x < p.slots * p.per) mg_pair_sim(&p, w + h * T0 * D, nrm + h * T0, D, x / p.per, x % p.per, sims + h * scap);
}

__global__ void mg_links_kernel(mg_pass p, const float *sims, int64_t *la, int64_t *lb, float *ls, int64_t *order,
                                int64_t cap, int64_t scap)
{
    const int64_t h = blockIdx.y, j = (int64_t)blockIdx.x * MG_THREADS + threadIdx.x;
    if (j >= p.slots) return;
    mg_slot_pick(&p, sims + h * scap, j, la + h * cap, lb + h * cap, ls + h * cap);
    order[h * cap + j] = -1;
}

__global__ void mg_rank_kernel(mg_pass p, const int64_t *la, const int64_t *lb, const float *ls, int64_t *order,
                               unsigned char *gone, int32_t *flag, int64_t T0, int64_t cap)
{
    const int64_t h = blockIdx.y, i = (int64_t)blockIdx.x * MG_THREADS + threadIdx.x;
    const int64_t *hla = la + h * cap, *hlb = lb + h * cap;
    if (i < p.slots) {
        const int64_t rank = mg_slot_rank(&p, hla, hlb, ls + h * cap, i);
        if (rank >= 0 && rank < p.r) {
            order[h * cap + rank] = i;
            gone[h * T0 + hla[i]] = 1;
        }
    }
    if (i == 0 && mg_count_links(&p, hlb) != p.links) flag[h] = 1;
}

__global__ void mg_merge_kernel(mg_pass p, float *wk, float *wv, float *deg, const int64_t *la, const int64_t *lb,
                                const int64_t *order, int64_t T0, int64_t D, int64_t cap)
{
    const int64_t h = blockIdx.y, j = (int64_t)blockIdx.x * MG_THREADS + threadIdx.x;
    if (j < p.slots)
        mg_slot_merge(&p, wk + h * T0 * D, wv + h * T0 * D, deg + h * T0, D, la + h * cap, lb + h * cap,
                      order + h * cap, j);
}

/* A block a head: each thread a run of the rows, its kept rows counted, the counts scanned
 * (Hillis-Steele in shared memory), then each run's indices from its first. */
__global__ void __launch_bounds__(MG_SCAN) mg_compact_kernel(const unsigned char *gone, int32_t *idx, int64_t T,
                                                               int64_t T0)
{
    __shared__ int32_t cnt[MG_SCAN];
    const int64_t h = blockIdx.y, run = (T + MG_SCAN - 1) / MG_SCAN, t0 = threadIdx.x * run;
    const int64_t t1 = t0 + run < T ? t0 + run : T, a = t0 < T ? t0 : T;
    const unsigned char *g = gone + h * T0;
    const int32_t c = (int32_t)mg_compact(g, a, t1 > a ? t1 : a, 0, NULL);
    cnt[threadIdx.x] = c;
    __syncthreads();
    for (int off = 1; off < MG_SCAN; off <<= 1) {
        const int32_t v = threadIdx.x >= off ? cnt[threadIdx.x - off] : 0;
        __syncthreads();
        cnt[threadIdx.x] += v;
        __syncthreads();
    }
    mg_compact(g, a, t1 > a ? t1 : a, cnt[threadIdx.x] - c, idx + h * T0);
}

/* The kept rows of W into W' in order; every row's gone flag cleared for the next pass. */
__global__ void mg_scatter_kernel(const float *wk, const float *wv, const float *deg, const int32_t *pos, float *ok,
                                  float *ov, float *odeg, int32_t *opos, const int32_t *idx, unsigned char *gone,
                                  int64_t T, int64_t T0, int64_t D)
{
    const int64_t h = blockIdx.y, x = (int64_t)blockIdx.x * MG_THREADS + threadIdx.x;
    if (x >= T * D) return;
    const int64_t t = x / D, d = x % D, o = idx[h * T0 + t], base = h * T0;
    if (o >= 0) {
        ok[(base + o) * D + d] = wk[(base + t) * D + d];
        ov[(base + o) * D + d] = wv[(base + t) * D + d];
        if (d == 0) {
            odeg[base + o] = deg[base + t];
            opos[base + o] = pos[base + t];
        }
    }
    if (d == 0) gone[base + t] = 0;
}

/* Source rows [next, next + n) after the `held` working rows. */
__global__ void mg_append_kernel(const float *sk, const float *sv, const float *sdeg, const int32_t *spos, float *wk,
                                 float *wv, float *wdeg, int32_t *wpos, int64_t held, int64_t next, int64_t n,
                                 int64_t T0, int64_t D)
{
    const int64_t h = blockIdx.y, x = (int64_t)blockIdx.x * MG_THREADS + threadIdx.x;
    if (x >= n * D) return;
    const int64_t t = x / D, d = x % D, base = h * T0;
    wk[(base + held + t) * D + d] = sk[(base + next + t) * D + d];
    wv[(base + held + t) * D + d] = sv[(base + next + t) * D + d];
    if (d == 0) {
        wdeg[base + held + t] = sdeg[base + next + t];
        wpos[base + held + t] = spos[base + next + t];
    }
}

static dim3 mg_grid(int64_t n, int H) { return dim3((unsigned)((n + MG_THREADS - 1) / MG_THREADS), (unsigned)H); }

static int mg_append(void *ctx, int64_t held, int64_t next, int64_t n)
{
    mg_dev *g = (mg_dev *)ctx;
    const int c = g->cur;
    if (n <= 0) return 0;
    mg_append_kernel<<<mg_grid(n * g->D, g->H), MG_THREADS, 0, g->ci->stream>>>(
        g->sk, g->sv, g->sdeg, g->spos, g->wk[c], g->wv[c], g->wdeg[c], g->wpos[c], held, next, n, g->T0, g->D);
    return ck(g->ci, cudaGetLastError(), "merge: rows arriving");
}

static int mg_pass_run(void *ctx, const mg_pass *p)
{
    mg_dev *g = (mg_dev *)ctx;
    const int c = g->cur, H = g->H;
    cudaStream_t s = g->ci->stream;
    mg_norms_kernel<<<mg_grid(p->m1 - p->m0, H), MG_THREADS, 0, s>>>(g->wk[c], g->nrm, g->T0, g->D, p->m0, p->m1);
    mg_pairs_kernel<<<mg_grid(p->slots * p->per, H), MG_THREADS, 0, s>>>(*p, g->wk[c], g->nrm, g->sims, g->T0, g->D,
                                                                          g->sims_cap);
    mg_links_kernel<<<mg_grid(p->slots, H), MG_THREADS, 0, s>>>(*p, g->sims, g->la, g->lb, g->ls, g->order,
                                                                g->slots_cap, g->sims_cap);
    mg_rank_kernel<<<mg_grid(p->slots, H), MG_THREADS, 0, s>>>(*p, g->la, g->lb, g->ls, g->order, g->gone, g->flag,
                                                               g->T0, g->slots_cap);
    mg_merge_kernel<<<mg_grid(p->slots, H), MG_THREADS, 0, s>>>(*p, g->wk[c], g->wv[c], g->wdeg[c], g->la, g->lb,
                                                                g->order, g->T0, g->D, g->slots_cap);
    mg_compact_kernel<<<dim3(1, (unsigned)H), MG_SCAN, 0, s>>>(g->gone, g->idx, p->T, g->T0);
    mg_scatter_kernel<<<mg_grid(p->T * g->D, H), MG_THREADS, 0, s>>>(
        g->wk[c], g->wv[c], g->wdeg[c], g->wpos[c], g->wk[c ^ 1], g->wv[c ^ 1], g->wdeg[c ^ 1], g->wpos[c ^ 1], g->idx,
        g->gone, p->T, g->T0, g->D);
    g->cur = c ^ 1;
    return ck(g->ci, cudaGetLastError(), "merge: a pass");
}

/* Carve the group's arrays out of the call's scratch (each 256-byte aligned): the bytes needed,
 * and with base given the pointers. */
static size_t mg_carve(mg_dev *g, char *base)
{
    size_t off = 0;
    const size_t rows = (size_t)g->H * (size_t)g->T0, slots = (size_t)g->H * (size_t)g->slots_cap;
#define MG_TAKE(ptr, type, n)                                                  \
    do {                                                                       \
        if (base) ptr = (type *)(base + off);                                  \
        off += ((sizeof(type) * (size_t)(n)) + 255) / 256 * 256;               \
    } while (0)
    MG_TAKE(g->sk, float, rows * (size_t)g->D);
    MG_TAKE(g->sv, float, rows * (size_t)g->D);
    MG_TAKE(g->sdeg, float, rows);
    MG_TAKE(g->spos, int32_t, rows);
    for (int c = 0; c < 2; c++) {
        MG_TAKE(g->wk[c], float, rows * (size_t)g->D);
        MG_TAKE(g->wv[c], float, rows * (size_t)g->D);
        MG_TAKE(g->wdeg[c], float, rows);
        MG_TAKE(g->wpos[c], int32_t, rows);
    }
    MG_TAKE(g->nrm, double, rows);
    MG_TAKE(g->sims, float, (size_t)g->H * (size_t)g->sims_cap);
    MG_TAKE(g->la, int64_t, slots);
    MG_TAKE(g->lb, int64_t, slots);
    MG_TAKE(g->order, int64_t, slots);
    MG_TAKE(g->ls, float, slots);
    MG_TAKE(g->gone, unsigned char, rows);
    MG_TAKE(g->idx, int32_t, rows);
    MG_TAKE(g->flag, int32_t, g->H);
#undef MG_TAKE
    return off;
}

/* The heads list[0 .. H) of m, all of T0 rows, merged on the device: 0 (their rows and counts on
 * the host), 1 when the CPU must merge them (memory short, a pass's links not the shape's; nothing
 * recorded, the host's rows untouched), -1 with the failure recorded. */
static int mg_group(cuda_impl *ci, const be_merge *m, const int *list, int H, int64_t T0)
{
    mg_need nd = { 1, 1 };
    const mg_steps dry = { &nd, mg_need_append, mg_need_pass };
    mg_plan(T0, m->target, m->gap, m->sinks, m->recent, m->chunk, m->replay, &dry);
    if (nd.pairs * (int64_t)sizeof(float) * H > MG_SIMS_MAX) return 1;   /* (chunks of thousands of rows) */
    mg_dev g;
    memset(&g, 0, sizeof g);
    g.T0 = T0, g.D = m->dim, g.H = H, g.ci = ci, g.slots_cap = nd.slots, g.sims_cap = nd.pairs;
    const size_t need = mg_carve(&g, NULL);
    if (grow_dev(ci, (void **)&ci->mg_buf, &ci->cap_mg_buf, need)) return scratch_short(ci);
    mg_carve(&g, (char *)ci->mg_buf);
    cudaStream_t s = ci->stream;
    const size_t rb = sizeof(float) * (size_t)T0 * (size_t)g.D, nb = sizeof(float) * (size_t)T0;
    for (int i = 0; i < H; i++) {
        const be_merge_head *mh = &m->heads[list[i]];
        const size_t o = (size_t)i * (size_t)T0;
        if (ck(ci, cudaMemcpyAsync(g.sk + o * (size_t)g.D, mh->k, rb, cudaMemcpyHostToDevice, s), "merge: rows up") ||
            ck(ci, cudaMemcpyAsync(g.sv + o * (size_t)g.D, mh->v, rb, cudaMemcpyHostToDevice, s), "merge: rows up") ||
            ck(ci, cudaMemcpyAsync(g.sdeg + o, mh->deg, nb, cudaMemcpyHostToDevice, s), "merge: degrees up") ||
            ck(ci, cudaMemcpyAsync(g.spos + o, mh->pos, sizeof(int32_t) * (size_t)T0, cudaMemcpyHostToDevice, s),
               "merge: positions up"))
            return -1;
        ci->bytes_up += 2 * rb + 2 * nb;
    }
    if (ck(ci, cudaMemsetAsync(g.gone, 0, (size_t)H * (size_t)T0, s), "merge: flags") ||
        ck(ci, cudaMemsetAsync(g.flag, 0, sizeof(int32_t) * (size_t)H, s), "merge: flags"))
        return -1;
    const mg_steps st = { &g, mg_append, mg_pass_run };
    const int64_t held = mg_plan(T0, m->target, m->gap, m->sinks, m->recent, m->chunk, m->replay, &st);
    if (held < 0) return -1;
    int32_t flags[BE_MERGE_MAX_HEADS];
    if (ck(ci, cudaMemcpyAsync(flags, g.flag, sizeof(int32_t) * (size_t)H, cudaMemcpyDeviceToHost, s), "merge: flags") ||
        sync_stream(ci, "merge"))
        return -1;
    for (int i = 0; i < H; i++)
        if (flags[i]) return 1;
    /* the rows come back page-locked, into the host's arrays only once all are there (a failure
     * part-way leaves those for the CPU to merge) */
    const int c = g.cur;
    const size_t kb = sizeof(float) * (size_t)held * (size_t)g.D, per = 2 * kb + 8 * (size_t)held;
    if (grow_host(ci, (void **)&ci->h_mg, &ci->cap_h_mg, per * (size_t)H)) return scratch_short(ci);
    char *hb = (char *)ci->h_mg;
    for (int i = 0; i < H; i++) {
        const size_t o = (size_t)i * (size_t)T0;
        char *at = hb + per * (size_t)i;
        if (ck(ci, cudaMemcpyAsync(at, g.wk[c] + o * (size_t)g.D, kb, cudaMemcpyDeviceToHost, s), "merge: rows down") ||
            ck(ci, cudaMemcpyAsync(at + kb, g.wv[c] + o * (size_t)g.D, kb, cudaMemcpyDeviceToHost, s),
               "merge: rows down") ||
            ck(ci, cudaMemcpyAsync(at + 2 * kb, g.wdeg[c] + o, 4 * (size_t)held, cudaMemcpyDeviceToHost, s),
               "merge: degrees down") ||
            ck(ci, cudaMemcpyAsync(at + 2 * kb + 4 * (size_t)held, g.wpos[c] + o, 4 * (size_t)held,
                                   cudaMemcpyDeviceToHost, s), "merge: positions down"))
            return -1;
        ci->bytes_down += per;
    }
    if (sync_stream(ci, "merge")) return -1;
    for (int i = 0; i < H; i++) {
        be_merge_head *mh = &m->heads[list[i]];
        const char *at = hb + per * (size_t)i;
        memcpy(mh->k, at, kb);
        memcpy(mh->v, at + kb, kb);
        memcpy(mh->deg, at + 2 * kb, 4 * (size_t)held);
        memcpy(mh->pos, at + 2 * kb + 4 * (size_t)held, 4 * (size_t)held);
        mh->n = held;
    }
    return 0;
}

/* Heads list[0 .. n) merged by the CPU backend (its threads), their counts written back. */
static int mg_on_cpu(cuda_impl *ci, const be_merge *m, const int *list, int n)
{
    be_merge_head sub[BE_MERGE_MAX_HEADS];
    for (int i = 0; i < n; i++) sub[i] = m->heads[list[i]];
    be_merge c = *m;
    c.heads = sub;
    c.n_heads = n;
    const int rc = be_host_merge_heads(ci->cpu, &c);
    for (int i = 0; i < n; i++) m->heads[list[i]].n = sub[i].n;
    return rc;
}

int cuda_merge_heads(be_backend *b, const be_merge *m)
{
    cuda_impl *ci = impl_of(b);
    seg_op(ci, SEG_EAGER);
    if (m->on_pass || m->n_heads < 1 || m->n_heads > BE_MERGE_MAX_HEADS || m->chunk < 1 || m->dim < 1 ||
        m->sinks < 0 || m->recent < 0 || m->gap < 0 || m->target < 0)
        return be_host_merge_heads(ci->cpu, m);
    char done[BE_MERGE_MAX_HEADS] = { 0 };
    int list[BE_MERGE_MAX_HEADS];
    for (int h0 = 0; h0 < m->n_heads; h0++) {
        if (done[h0]) continue;
        const int64_t T0 = m->heads[h0].n;
        int n = 0;
        for (int h = h0; h < m->n_heads; h++)   /* the heads of h0's count: one group */
            if (!done[h] && m->heads[h].n == T0) {
                list[n++] = h;
                done[h] = 1;
            }
        if (T0 <= 0) continue;
        const int rc = ci->failed ? 1 : mg_group(ci, m, list, n, T0);
        if (rc != 0 && mg_on_cpu(ci, m, list, n) != 0) return -1;   /* a failure stays recorded for the caller */
    }
    /* a prompt's merge may have taken a GiB: given back (a decode step's merges, every gap tokens,
     * keep theirs), so that the cache's pages can have it */
    if (ci->cap_mg_buf > MG_KEEP_BYTES && !ci->failed && seg_end(ci) == 0) {
        cudaFree(ci->mg_buf);
        ci->scratch_bytes -= ci->cap_mg_buf;
        ci->mg_buf = NULL;
        ci->cap_mg_buf = 0;
    }
    return 0;
}
