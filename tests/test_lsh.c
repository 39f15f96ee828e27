/* LASER-KV's SimHash recall (be_ops.lsh_hits, kernels/backend.h be_lsh): the planes' dots side by
 * side (vd_plane_dots) against the plain loop on every instruction set, bit for bit; the CPU
 * backend's hits against the definition written as LASER-KV first computed it (a code a vector and
 * round by a plain loop over one plane at a time, every query code compared), whatever the threads;
 * and the CUDA kernel's threads (kernels/cuda/lsh_hits.cu) run on the host against the CPU
 * backend. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/quant.h"
#include "kernels/backend.h"
#include "kernels/cpu/vec_dot.h"
#include "kernels/lsh_kernels.h"
#include "kernels/mass_kernels.h"

static uint64_t next(uint64_t *r)
{
    *r = *r * 6364136223846793005ull + 1442695040888963407ull;
    return *r >> 33;
}

/* Values of every scale, with zeros, negative zeros and exact ties among them, so that sums cancel
 * and dots land on 0 and near it. */
static float wild(uint64_t *r)
{
    switch (next(r) % 8) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return (float)((int64_t)(next(r) % 5) - 2);
    case 3: return ldexpf((float)((int64_t)(next(r) % 2001) - 1000), -(int)(next(r) % 40));
    default: return (float)((int64_t)(next(r) % 20001) - 10000) / 10000.0f;
    }
}

Test(lsh, the_planes_dots_side_by_side_give_the_plain_loops_floats_on_every_instruction_set)
{
    uint64_t r = 7;
    const int Ps[] = { 1, 7, 8, 9, 31, 32, 33, 64, 100 }, Ds[] = { 1, 5, 64, 128, 256 };
    for (size_t pi = 0; pi < sizeof Ps / sizeof *Ps; pi++)
        for (size_t di = 0; di < sizeof Ds / sizeof *Ds; di++) {
            const int P = Ps[pi], D = Ds[di];
            float *pt = malloc(sizeof(float) * (size_t)(P * D)), *x = malloc(sizeof(float) * (size_t)D);
            float *got = malloc(sizeof(float) * (size_t)P);
            cr_assert(pt && x && got);
            for (int i = 0; i < P * D; i++) pt[i] = wild(&r);
            for (int i = 0; i < D; i++) x[i] = wild(&r);
            const vd_isa was = vd_isa_active();
            char err[128];
            for (int isa = VD_ISA_SCALAR; isa < VD_ISA_COUNT; isa++) {
                if (!vd_isa_supported((vd_isa)isa)) continue;
                cr_assert(vd_set_isa((vd_isa)isa, err, sizeof err) == 0, "%s", err);
                vd_plane_dots(D, P, pt, x, got);
                for (int p = 0; p < P; p++) {
                    float want = lsh_dot(pt, P, p, x, D);
                    cr_assert(memcmp(&want, &got[p], sizeof want) == 0, "%s, P %d, D %d, plane %d: %a, not %a",
                              vd_isa_name((vd_isa)isa), P, D, p, (double)got[p], (double)want);
                }
            }
            cr_assert(vd_set_isa(was, err, sizeof err) == 0, "%s", err);
            free(pt);
            free(x);
            free(got);
        }
}

/* A call's inputs: H KV heads of pages (varying fill, rows stride apart, positions ascending with
 * gaps), query rows for G query heads each, planes, and the room the op fills. */
typedef struct lsh_case {
    int H, G, D, rounds, bits, n_q;
    int64_t np, T, stride;
    be_kv_page *pages;
    int64_t hp[9];
    uint16_t *k;
    int32_t *pos;
    float *q, *planes_t;
    uint32_t *codes;
    int32_t *hits;
} lsh_case;

static void make_case(lsh_case *c, uint64_t *r, int H, int G, int D, int rounds, int bits, int n_q)
{
    memset(c, 0, sizeof *c);
    c->H = H, c->G = G, c->D = D, c->rounds = rounds, c->bits = bits, c->n_q = n_q;
    c->stride = D + 3;
    int per[8];
    for (int h = 0; h < H; h++) {
        per[h] = h == 1 ? 0 : 2 + (int)(next(r) % 5);   /* head 1 has no page */
        c->hp[h + 1] = c->hp[h] + per[h];
    }
    c->np = c->hp[H];
    c->pages = calloc((size_t)c->np + 1, sizeof *c->pages);
    c->k = malloc(sizeof(uint16_t) * (size_t)(c->np * 40) * (size_t)c->stride);
    c->pos = malloc(sizeof(int32_t) * (size_t)(c->np * 40));
    cr_assert(c->pages && c->k && c->pos);
    for (int h = 0; h < H; h++) {
        int32_t p = (int32_t)(next(r) % 5);
        for (int64_t i = c->hp[h]; i < c->hp[h + 1]; i++) {
            be_kv_page *pg = &c->pages[i];
            pg->n = 1 + (int32_t)(next(r) % 40);
            pg->stride = (int32_t)c->stride;
            pg->k = c->k + c->T * c->stride;
            pg->pos = c->pos + c->T;
            for (int32_t t = 0; t < pg->n; t++) {
                c->pos[c->T + t] = p;
                p += 1 + (int32_t)(next(r) % 3);
                for (int d = 0; d < D; d++) {
                    /* some keys all zero or the negation of another: dots at exactly 0 */
                    float v = t % 11 == 3 ? 0.0f : wild(r);
                    c->k[(c->T + t) * c->stride + d] = quant_f32_to_fp16(v);
                }
            }
            c->T += pg->n;
        }
    }
    const int P = rounds * bits;
    c->q = malloc(sizeof(float) * (size_t)(n_q * H * G * D));
    c->planes_t = malloc(sizeof(float) * (size_t)(P * D));
    c->codes = malloc(sizeof(uint32_t) * (size_t)(H * rounds * n_q * G));
    c->hits = malloc(sizeof(int32_t) * (size_t)c->T);
    cr_assert(c->q && c->planes_t && c->codes && c->hits);
    for (int i = 0; i < n_q * H * G * D; i++) c->q[i] = wild(r);
    /* a query equal to a key: its codes collide with that key's in every round */
    for (int d = 0; d < D; d++) c->q[d] = quant_fp16_to_f32(c->k[d]);
    for (int i = 0; i < P * D; i++) c->planes_t[i] = wild(r);
}

static be_lsh call_of(const lsh_case *c, int64_t pos_min)
{
    return (be_lsh){ c->q,     c->n_q,      (int64_t)c->H * c->G * c->D,    0,        c->G,     c->D,
                     c->planes_t, c->rounds, c->bits, c->pages, c->np, c->H, c->H > 1 ? c->hp : NULL,
                     pos_min, c->codes, c->hits, 0x15Bu };
}

static void free_case(lsh_case *c)
{
    free(c->pages);
    free(c->k);
    free(c->pos);
    free(c->q);
    free(c->planes_t);
    free(c->codes);
    free(c->hits);
}

/* The code of vector v in round r as LASER-KV first computed it: each plane's dot a plain loop. */
static uint32_t plain_code(const lsh_case *c, int r, const float *v)
{
    const int P = c->rounds * c->bits;
    uint32_t code = 0;
    for (int b = 0; b < c->bits; b++) {
        float d = 0;
        for (int i = 0; i < c->D; i++) d += c->planes_t[i * P + r * c->bits + b] * v[i];
        code |= (uint32_t)(d >= 0) << b;
    }
    return code;
}

/* The definition: every query code compared with the key's, round by round. */
static void plain_hits(const lsh_case *c, int64_t pos_min, int32_t *want)
{
    float *kf = malloc(sizeof(float) * (size_t)c->D);
    cr_assert(kf);
    int64_t j = 0;
    for (int h = 0; h < c->H; h++)
        for (int64_t i = c->hp[h]; i < c->hp[h + 1]; i++) {
            const be_kv_page *pg = &c->pages[i];
            for (int32_t t = 0; t < pg->n; t++, j++) {
                want[j] = 0;
                if (pg->pos[t] < pos_min) continue;
                for (int d = 0; d < c->D; d++) kf[d] = quant_fp16_to_f32(pg->k[t * pg->stride + d]);
                for (int r = 0; r < c->rounds; r++) {
                    uint32_t kc = plain_code(c, r, kf);
                    for (int tq = 0; tq < c->n_q; tq++)
                        for (int hh = 0; hh < c->G; hh++)
                            want[j] += plain_code(c, r, c->q + tq * c->H * c->G * c->D + (h * c->G + hh) * c->D) == kc;
                }
            }
        }
    free(kf);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

Test(lsh, the_cpu_gives_the_definitions_hits_whatever_the_threads)
{
    uint64_t r = 11;
    const int shapes[][6] = { /* H, G, D, rounds, bits, n_q */
                              { 1, 1, 16, 1, 1, 1 }, { 3, 2, 40, 4, 5, 3 }, { 2, 4, 128, 8, 8, 4 },
                              { 4, 1, 64, 3, 30, 2 }, { 1, 3, 256, 64, 2, 1 }, { 2, 1, 1024, 2, 12, 1 } };
    be_backend *one = be_cpu_create(1, NULL, 0), *three = be_cpu_create(3, NULL, 0);
    cr_assert(one && three);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int *sh = shapes[s];
        lsh_case c;
        make_case(&c, &r, sh[0], sh[1], sh[2], sh[3], sh[4], sh[5]);
        int32_t *want = malloc(sizeof(int32_t) * (size_t)c.T);
        cr_assert(want);
        const int64_t mins[] = { 0, c.pages[0].pos[c.pages[0].n / 2] + 1, 1 << 30 };
        for (size_t mi = 0; mi < 3; mi++) {
            plain_hits(&c, mins[mi], want);
            int64_t any = 0;
            for (int64_t j = 0; j < c.T; j++) any += want[j];
            cr_expect(mi > 0 || any > 0, "shape %zu: no hit at all", s);
            be_backend *bs[] = { one, three, NULL };
            for (int bi = 0; bi < 3; bi++) {
                for (int64_t j = 0; j < c.T; j++) c.hits[j] = -7;
                be_lsh l = call_of(&c, mins[mi]);
                if (bs[bi]) be_lsh_hits(bs[bi], &l);
                else be_host_lsh_hits(NULL, &l);   /* no backend: the calling thread alone */
                int bad = 0;
                for (int64_t j = 0; j < c.T; j++) bad += c.hits[j] != want[j];
                cr_expect_eq(bad, 0, "shape %zu, pos_min %lld, backend %d: %d of %lld tokens' hits differ", s,
                             (long long)mins[mi], bi, bad, (long long)c.T);
                /* the query codes are left sorted, each (head, round) the definition's codes */
                const int64_t nq = (int64_t)c.n_q * c.G;
                uint32_t *mine = malloc(sizeof(uint32_t) * (size_t)nq);
                cr_assert(mine);
                for (int h = 0; h < c.H; h++)
                    for (int rr = 0; rr < c.rounds; rr++) {
                        for (int tq = 0; tq < c.n_q; tq++)
                            for (int hh = 0; hh < c.G; hh++)
                                mine[tq * c.G + hh] = plain_code(&c, rr, c.q + tq * c.H * c.G * c.D + (h * c.G + hh) * c.D);
                        qsort(mine, (size_t)nq, sizeof *mine, cmp_u32);
                        cr_expect(memcmp(mine, c.codes + (h * c.rounds + rr) * nq, sizeof *mine * (size_t)nq) == 0,
                                  "shape %zu: head %d round %d's query codes", s, h, rr);
                    }
                free(mine);
            }
        }
        free(want);
        free_case(&c);
    }
    be_free(one);
    be_free(three);
}

/* The CUDA kernel as kernels/cuda/lsh_hits.cu runs it: a block a page, its tokens LSH_TILE at a
 * time, every thread's items of each phase (the codes or'ed and the counts added in shared memory,
 * in whatever order the threads run: here thread by thread). */
static void kernel_on_host(const be_lsh *l, const int64_t *hp, int H, int32_t *hits)
{
    const int P = l->rounds * l->bits, D = l->head_dim;
    const int64_t nq = l->n_q * l->group;
    int64_t *first = malloc(sizeof(int64_t) * (size_t)(l->n_pages + H + 1)), *tok0 = first + l->n_pages;
    cr_assert(first);
    ms_offsets(l->pages, hp, H, first, tok0);
    static float ks[LSH_TILE * LSH_DEV_MAX_D];
    uint32_t code[LSH_TILE * LSH_MAX_ROUNDS];
    int32_t cnt[LSH_TILE];
    for (int64_t blk = 0; blk < l->n_pages; blk++) {
        const be_kv_page pg = l->pages[blk];
        const int h = ms_head_of(hp, H, blk);
        int32_t *out = hits + tok0[h] + first[blk];
        const uint32_t *codes = l->codes + (int64_t)h * l->rounds * nq;
        for (int32_t t0 = 0; t0 < pg.n; t0 += LSH_TILE) {
            const int nt = pg.n - t0 < LSH_TILE ? pg.n - t0 : LSH_TILE;
            for (int tid = 0; tid < LSH_THREADS; tid++) {
                for (int x = tid; x < nt * D; x += LSH_THREADS)
                    ks[x] = quant_fp16_to_f32(pg.k[(size_t)(t0 + x / D) * (size_t)pg.stride + (size_t)(x % D)]);
                for (int x = tid; x < nt * l->rounds; x += LSH_THREADS) code[x] = 0;
                if (tid < LSH_TILE) cnt[tid] = 0;
            }
            for (int tid = 0; tid < LSH_THREADS; tid++)
                for (int x = tid; x < nt * P; x += LSH_THREADS) {
                    const int t = x / P, p = x % P;
                    if (pg.pos[t0 + t] < l->pos_min) continue;
                    code[t * l->rounds + p / l->bits] |= lsh_bit(lsh_dot(l->planes_t, P, p, ks + t * D, D), p % l->bits);
                }
            for (int tid = 0; tid < LSH_THREADS; tid++)
                for (int x = tid; x < nt * l->rounds; x += LSH_THREADS) {
                    const int t = x / l->rounds, rr = x % l->rounds;
                    if (pg.pos[t0 + t] >= l->pos_min) cnt[t] += lsh_count(codes + rr * nq, nq, code[x]);
                }
            for (int tid = 0; tid < nt; tid++) out[t0 + tid] = cnt[tid];
        }
    }
    free(first);
}

Test(lsh, the_cuda_kernels_threads_run_on_the_host_give_the_cpus_hits)
{
    uint64_t r = 23;
    const int shapes[][6] = { { 3, 2, 40, 4, 5, 3 }, { 2, 4, 128, 8, 8, 4 }, { 1, 2, 256, 64, 3, 2 } };
    be_backend *cpu = be_cpu_create(2, NULL, 0);
    cr_assert(cpu);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int *sh = shapes[s];
        lsh_case c;
        make_case(&c, &r, sh[0], sh[1], sh[2], sh[3], sh[4], sh[5]);
        int32_t *got = malloc(sizeof(int32_t) * (size_t)c.T);
        cr_assert(got);
        const int64_t pos_min = c.pages[0].pos[c.pages[0].n / 2];
        be_lsh l = call_of(&c, pos_min);
        be_lsh_hits(cpu, &l);   /* the hits, and the sorted query codes the kernel reads */
        int64_t hp1[2] = { 0, c.np };
        for (int64_t j = 0; j < c.T; j++) got[j] = -7;
        kernel_on_host(&l, c.H > 1 ? c.hp : hp1, c.H, got);
        int bad = 0;
        for (int64_t j = 0; j < c.T; j++) bad += got[j] != c.hits[j];
        cr_expect_eq(bad, 0, "shape %zu: %d of %lld tokens' hits differ from the CPU's", s, bad, (long long)c.T);
        free(got);
        free_case(&c);
    }
    be_free(cpu);
}

/* lsh_count against counting by hand, over runs of equal codes, the ends and empty arrays. */
Test(lsh, the_binary_searches_count_equal_codes)
{
    const uint32_t a[] = { 0, 0, 1, 3, 3, 3, 7, 0xffffffffu, 0xffffffffu };
    const int64_t n = sizeof a / sizeof *a;
    const uint32_t probes[] = { 0, 1, 2, 3, 4, 7, 8, 0xfffffffeu, 0xffffffffu };
    for (int64_t len = 0; len <= n; len++)
        for (size_t i = 0; i < sizeof probes / sizeof *probes; i++) {
            int32_t want = 0;
            for (int64_t j = 0; j < len; j++) want += a[j] == probes[i];
            cr_expect_eq(lsh_count(a, len, probes[i]), want, "%u in the first %lld", probes[i], (long long)len);
        }
}
