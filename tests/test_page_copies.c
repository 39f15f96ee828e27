/* test_page_copies.c - the CUDA backend's table of device copies of KV pages (kernels/page_copies.c),
 * with host memory standing in for the device: copies equal their pages after appends (only the new
 * rows move), rewrites under a new generation (the page moves whole), growth past the storage, a few
 * thousand pages (the table rehashes), idle copies are freed and in-use ones kept, and running out of
 * device memory leaves the table as it was. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/page_copies.h"
#include "kernels/page_fill.h"

typedef struct fake_dev {
    int64_t allocs, releases, live;
    int64_t fail_after;   /* allocations that succeed before the device is "full" (-1: never) */
    uint64_t uploaded;
    int fail_uploads;     /* uploads refuse (a full staging buffer) */
} fake_dev;

static void *f_alloc(void *ud, size_t bytes)
{
    fake_dev *d = ud;
    if (d->fail_after >= 0 && d->allocs >= d->fail_after) return NULL;
    d->allocs++;
    d->live++;
    return malloc(bytes);
}

static void f_release(void *ud, void *p)
{
    fake_dev *d = ud;
    if (!p) return;
    d->releases++;
    d->live--;
    free(p);
}

static int f_upload(void *ud, void *dst, const void *src, size_t bytes)
{
    fake_dev *d = ud;
    if (d->fail_uploads) return -1;
    d->uploaded += bytes;
    memcpy(dst, src, bytes);
    return 0;
}

enum { D = 16, ROWS = 64 };

typedef struct host_page {
    uint16_t k[ROWS * D], v[ROWS * D];
    int32_t pos[ROWS];
    float bias[ROWS];
    be_kv_page pg;
} host_page;

static uint64_t gen_next = 1;

static void fill(host_page *h, int n, uint16_t salt, int with_bias)
{
    for (int i = 0; i < ROWS * D; i++) {
        h->k[i] = (uint16_t)(i * 7 + salt);
        h->v[i] = (uint16_t)(i * 13 + salt);
    }
    for (int i = 0; i < ROWS; i++) {
        h->pos[i] = i + salt;
        h->bias[i] = (float)(i % 3) * 0.5f;
    }
    h->pg = (be_kv_page){ h->k, h->v, h->pos, with_bias ? h->bias : NULL, NULL, n, D, 0, gen_next++, ROWS, NULL };
}

static void expect_copy(const pc_copy *c, const host_page *h)
{
    cr_assert(c);
    int n = h->pg.n;
    cr_expect_eq(c->n_up, n);
    cr_expect(!memcmp(c->k, h->k, sizeof(uint16_t) * (size_t)(n * D)), "keys differ");
    cr_expect(!memcmp(c->v, h->v, sizeof(uint16_t) * (size_t)(n * D)), "values differ");
    cr_expect(!memcmp(c->pos, h->pos, sizeof(int32_t) * (size_t)n), "positions differ");
    if (h->pg.bias) cr_expect(!memcmp(c->bias, h->bias, sizeof(float) * (size_t)n), "bias differs");
}

static pc_table make(fake_dev *d, uint64_t idle)
{
    memset(d, 0, sizeof *d);
    d->fail_after = -1;
    pc_device dev = { d, f_alloc, f_release, f_upload };
    pc_table t;
    pc_init(&t, &dev, idle);
    return t;
}

Test(page_copies, appends_move_only_the_new_rows_and_new_generations_move_the_page)
{
    fake_dev d;
    pc_table t = make(&d, 1000);
    static host_page h;
    fill(&h, 10, 1, 1);
    pc_begin_call(&t);
    expect_copy(pc_get(&t, &h.pg), &h);
    cr_expect_eq(t.rows_uploaded, 10);
    /* the same generation, three more rows: only they move */
    h.pg.n = 13;
    expect_copy(pc_get(&t, &h.pg), &h);
    cr_expect_eq(t.rows_uploaded, 13);
    /* nothing new: nothing moves */
    expect_copy(pc_get(&t, &h.pg), &h);
    cr_expect_eq(t.rows_uploaded, 13);
    /* rows rewritten under a new generation (a truncated page written again): all of it moves */
    for (int i = 0; i < 5 * D; i++) h.k[i] ^= 0x5555;
    h.pg.gen = gen_next++;
    expect_copy(pc_get(&t, &h.pg), &h);
    cr_expect_eq(t.rows_uploaded, 26);
    /* the same content with fewer rows and the old generation cannot be trusted either */
    h.pg.n = 4;
    expect_copy(pc_get(&t, &h.pg), &h);
    /* a page whose capacity was not known grows past its storage: new storage, the whole page */
    h.pg.n = 8;
    h.pg.cap = 0;
    h.pg.k += 8 * D;   /* another page */
    h.pg.v += 8 * D;
    h.pg.gen = gen_next++;
    int64_t allocs = d.allocs;
    pc_get(&t, &h.pg);
    h.pg.n = 20;
    const pc_copy *c = pc_get(&t, &h.pg);
    cr_assert(c);
    cr_expect_eq(d.allocs, allocs + 2, "storage for 8 rows, then for 20, one allocation each");
    cr_expect(!memcmp(c->k, h.k + 8 * D, sizeof(uint16_t) * 20 * D), "keys differ after growth");
    cr_expect_eq(t.n, 2);
    pc_free(&t);
    cr_expect_eq(d.live, 0, "every allocation was released");
}

Test(page_copies, thousands_of_pages_rehash_and_stay_right)
{
    fake_dev d;
    pc_table t = make(&d, 100000);
    enum { N = 3000 };
    host_page *h = calloc(N, sizeof *h);
    cr_assert(h);
    pc_begin_call(&t);
    for (int i = 0; i < N; i++) {
        fill(&h[i], 1 + i % ROWS, (uint16_t)i, i % 5 == 0);
        expect_copy(pc_get(&t, &h[i].pg), &h[i]);
    }
    cr_expect_eq(t.n, N);
    cr_expect_geq(t.cap, 2 * N);
    uint64_t up = t.rows_uploaded;
    for (int i = 0; i < N; i++) expect_copy(pc_get(&t, &h[i].pg), &h[i]);
    cr_expect_eq(t.rows_uploaded, up, "a second pass over unchanged pages moves nothing");
    pc_free(&t);
    cr_expect_eq(d.live, 0);
    free(h);
}

Test(page_copies, idle_copies_are_freed_and_used_ones_kept)
{
    fake_dev d;
    pc_table t = make(&d, 4);
    static host_page a, b;
    fill(&a, 8, 1, 0);
    fill(&b, 8, 2, 0);
    pc_begin_call(&t);
    pc_get(&t, &a.pg);
    pc_get(&t, &b.pg);
    uint64_t bytes_two = t.bytes;
    for (int call = 0; call < 8; call++) {
        pc_begin_call(&t);
        expect_copy(pc_get(&t, &a.pg), &a);
    }
    cr_expect_eq(t.n, 1, "the copy nobody used was freed");
    cr_expect_lt(t.bytes, bytes_two);
    cr_expect_eq(t.rows_uploaded, 16, "the copy in use was never sent again");
    /* b comes back: a fresh copy */
    expect_copy(pc_get(&t, &b.pg), &b);
    cr_expect_eq(t.rows_uploaded, 24);
    pc_free(&t);
    cr_expect_eq(d.live, 0);
}

Test(page_copies, out_of_device_memory_leaves_the_table_as_it_was)
{
    fake_dev d;
    pc_table t = make(&d, 100);
    static host_page a, b;
    fill(&a, 8, 1, 0);
    fill(&b, 8, 2, 0);
    a.pg.cap = 0;   /* storage for exactly its 8 rows */
    pc_begin_call(&t);
    expect_copy(pc_get(&t, &a.pg), &a);
    d.fail_after = d.allocs;   /* the next copy's storage */
    cr_expect_null(pc_get(&t, &b.pg));
    cr_expect_eq(t.n, 1);
    cr_expect_eq(d.live, 1, "only the first copy's storage is held");
    /* a growing page that cannot get bigger storage keeps its old copy */
    a.pg.n = 40;
    cr_expect_null(pc_get(&t, &a.pg));
    d.fail_after = -1;
    expect_copy(pc_get(&t, &a.pg), &a);
    pc_free(&t);
    cr_expect_eq(d.live, 0);
}

Test(page_copies, a_failed_upload_is_sent_again)
{
    fake_dev d;
    pc_table t = make(&d, 100);
    static host_page a;
    fill(&a, 8, 1, 0);
    pc_begin_call(&t);
    expect_copy(pc_get(&t, &a.pg), &a);
    /* three rows appended, but the device refuses the copy: no copy is handed out... */
    a.pg.n = 11;
    d.fail_uploads = 1;
    cr_expect_null(pc_get(&t, &a.pg));
    /* ...and the rows are not counted as sent: the next call sends them */
    d.fail_uploads = 0;
    expect_copy(pc_get(&t, &a.pg), &a);
    pc_free(&t);
    cr_expect_eq(d.live, 0);
}

/* Rows [row0, row0 + n) written by the "device" itself after pc_fill: here, copied from the page as
 * the device would compute them. */
static void device_writes(pc_copy *c, const host_page *h, int32_t row0, int32_t n)
{
    memcpy(c->k + (size_t)row0 * D, h->k + (size_t)row0 * D, sizeof(uint16_t) * (size_t)(n * D));
    memcpy(c->v + (size_t)row0 * D, h->v + (size_t)row0 * D, sizeof(uint16_t) * (size_t)(n * D));
    memcpy(c->pos + row0, h->pos + row0, sizeof(int32_t) * (size_t)n);
}

/* pc_fill: the rows the device writes itself are not sent, the rows below them that the copy lacks
 * are (a fresh copy of a page with rows already, a new generation), the biases go as pc_get sends
 * them, and a pc_get after it sends nothing; rows outside the page are refused. */
Test(page_copies, rows_the_device_writes_itself_are_not_sent_and_those_below_them_are)
{
    fake_dev d;
    pc_table t = make(&d, 1000);
    static host_page h;
    fill(&h, 32, 3, 0);
    pc_begin_call(&t);
    /* a fresh page filled from its start: nothing sent */
    h.pg.n = 12;
    pc_copy *c = pc_fill(&t, &h.pg, 0, 12);
    cr_assert(c);
    device_writes(c, &h, 0, 12);
    cr_expect_eq(t.rows_uploaded, 0);
    cr_expect_eq(t.rows_filled, 12);
    expect_copy(pc_get(&t, &h.pg), &h);
    cr_expect_eq(t.rows_uploaded, 0, "the rows the device wrote are current");
    /* more rows of the same generation: the device writes them too */
    h.pg.n = 30;
    c = pc_fill(&t, &h.pg, 12, 18);
    device_writes(c, &h, 12, 18);
    expect_copy(pc_get(&t, &h.pg), &h);
    cr_expect_eq(t.rows_uploaded, 0);
    /* a page the device has no copy of, with rows already (a fork's copy, taken on the host): its
     * first rows go up, the new ones do not */
    static host_page g;
    fill(&g, 40, 9, 1);
    g.pg.n = 25;
    c = pc_fill(&t, &g.pg, 20, 5);
    cr_assert(c);
    cr_expect_eq(t.rows_uploaded, 20, "the 20 rows below the filled ones were sent");
    cr_expect(!memcmp(c->bias, g.bias, sizeof(float) * 25), "the biases were sent");
    device_writes(c, &g, 20, 5);
    expect_copy(pc_get(&t, &g.pg), &g);
    cr_expect_eq(t.rows_uploaded, 20);
    /* a new generation (rows rewritten on the host): rows below row0 go again */
    for (int i = 0; i < 30 * D; i++) h.k[i] ^= 0x3333;
    h.pg.gen = gen_next++;
    h.pg.n = 32;
    c = pc_fill(&t, &h.pg, 30, 2);
    device_writes(c, &h, 30, 2);
    cr_expect_eq(t.rows_uploaded, 50);
    expect_copy(pc_get(&t, &h.pg), &h);
    /* rows the page does not hold, or none */
    cr_expect_null(pc_fill(&t, &h.pg, 30, 3));
    cr_expect_null(pc_fill(&t, &h.pg, -1, 2));
    cr_expect_null(pc_fill(&t, &h.pg, 4, 0));
    /* a refused upload: nothing counts as sent, and the next pc_get sends everything */
    h.pg.gen = gen_next++;
    d.fail_uploads = 1;
    cr_expect_null(pc_fill(&t, &h.pg, 31, 1));
    d.fail_uploads = 0;
    expect_copy(pc_get(&t, &h.pg), &h);
    cr_expect_eq(t.rows_uploaded, 82);
    pc_free(&t);
    cr_expect_eq(d.live, 0);
}

/* ---- the device's rows into its copies (kernels/page_fill.h) */

/* pf_half, the device's rounding as the host runs it, gives the cache's f16 for every float tried
 * (a stride through every bit pattern, and the edges: the largest half, the first float rounding to
 * an infinity, the smallest normal and subnormal halves and the ties between them, float
 * subnormals, zeros, infinities); a NaN gives a NaN. */
Test(page_copies, the_devices_rounding_is_the_caches)
{
    static const uint32_t edges[] = { 0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477ff001u, 0x47800000u, 0x38800000u,
                                      0x387fffffu, 0x33800000u, 0x33000000u, 0x33000001u, 0x32ffffffu, 0x33c00000u,
                                      0x00000001u, 0x007fffffu, 0x00000000u, 0x7f800000u, 0x3f800000u, 0x3f801000u,
                                      0x3f803000u, 0x38801000u, 0x38803000u };
    int64_t tried = 0;
    for (int pass = 0; pass < 2; pass++) {
        uint64_t n = pass ? sizeof edges / sizeof *edges * 2 : (1ull << 32) / 4099 + 1;
        for (uint64_t i = 0; i < n; i++) {
            uint32_t u = pass ? edges[i / 2] | (i % 2 ? 0x80000000u : 0) : (uint32_t)(i * 4099u);
            float x;
            memcpy(&x, &u, 4);
            uint16_t want, got = pf_half(x);
            be_host_f32_to_f16(1, &x, &want);
            if (x != x) {
                cr_assert((got & 0x7c00u) == 0x7c00u && (got & 0x3ffu), "0x%08x: NaN gave 0x%04x", u, got);
                continue;
            }
            cr_assert_eq(got, want, "0x%08x (%g): 0x%04x, the cache's 0x%04x", u, (double)x, got, want);
            tried++;
        }
    }
    cr_expect(tried > 1000000);
}

/* pf_fill over every thread of a few launch widths writes each row's f16 values at the copy's stride
 * and the positions, and nothing past the rows. */
Test(page_copies, the_fill_writes_the_rows_and_positions_and_nothing_else)
{
    enum { ROWS_IN = 7, DIM = 20, SRC = 3 * DIM + 4, DST = DIM };
    static float k[ROWS_IN * SRC], v[ROWS_IN * SRC];
    for (int i = 0; i < ROWS_IN * SRC; i++) {
        k[i] = (float)(i % 97) * 0.37f - 11.0f;
        v[i] = (float)(i % 89) * -0.71f + 5.0f;
    }
    static const int widths[] = { 1, 3, 32, 256 };
    for (size_t w = 0; w < sizeof widths / sizeof *widths; w++) {
        uint16_t dk[(ROWS_IN + 1) * DST], dv[(ROWS_IN + 1) * DST];
        int32_t dpos[ROWS_IN + 1];
        memset(dk, 0xee, sizeof dk);
        memset(dv, 0xee, sizeof dv);
        memset(dpos, 0xee, sizeof dpos);
        pf_job j = { k + SRC, v + SRC, dk, dv, dpos, SRC, DST, ROWS_IN - 1, DIM, 4000 };
        for (int t = 0; t < widths[w]; t++) pf_fill(&j, t, widths[w]);
        for (int r = 0; r < ROWS_IN - 1; r++) {
            uint16_t want[DIM], wantv[DIM];
            be_host_f32_to_f16(DIM, k + (r + 1) * SRC, want);
            be_host_f32_to_f16(DIM, v + (r + 1) * SRC, wantv);
            cr_assert(!memcmp(dk + r * DST, want, sizeof want), "width %d: keys of row %d", widths[w], r);
            cr_assert(!memcmp(dv + r * DST, wantv, sizeof wantv), "width %d: values of row %d", widths[w], r);
            cr_assert_eq(dpos[r], 4000 + r);
        }
        cr_assert(dk[(ROWS_IN - 1) * DST] == 0xeeee && dv[(ROWS_IN - 1) * DST] == 0xeeee &&
                      dpos[ROWS_IN - 1] == (int32_t)0xeeeeeeee,
                  "width %d: nothing past the rows", widths[w]);
    }
}

/* pc_find gives a copy only where it holds the rows asked for under the page's generation, and
 * makes or sends nothing. */
Test(page_copies, a_copy_is_found_only_where_it_holds_the_rows)
{
    fake_dev d;
    pc_table t = make(&d, 1000);
    static host_page h, g;
    fill(&h, 20, 5, 0);
    fill(&g, 20, 6, 1);
    pc_begin_call(&t);
    cr_expect_null(pc_find(&t, &h.pg, 4), "an empty table");
    cr_assert(pc_get(&t, &h.pg));
    const int64_t allocs = d.allocs;
    const uint64_t up = t.rows_uploaded;
    const pc_copy *c = pc_find(&t, &h.pg, 20);
    cr_assert(c);
    cr_expect(!memcmp(c->k, h.k, sizeof(uint16_t) * 20 * D));
    cr_expect_not_null(pc_find(&t, &h.pg, 7));
    h.pg.n = 24;   /* rows the copy does not have yet */
    cr_expect_not_null(pc_find(&t, &h.pg, 20));
    cr_expect_null(pc_find(&t, &h.pg, 21));
    cr_expect_null(pc_find(&t, &h.pg, 25), "past the page");
    cr_expect_null(pc_find(&t, &h.pg, 0));
    h.pg.gen = gen_next++;
    cr_expect_null(pc_find(&t, &h.pg, 4), "another generation");
    cr_expect_null(pc_find(&t, &g.pg, 4), "a page without a copy");
    cr_expect_eq(d.allocs, allocs, "pc_find made a copy");
    cr_expect_eq(t.rows_uploaded, up, "pc_find sent rows");
    pc_free(&t);
}

/* pf_move over every thread of a few launch widths copies a run's keys, values and positions and
 * nothing past them. */
Test(page_copies, a_move_copies_the_run_and_nothing_else)
{
    enum { RUN = 5, STRIDE = 24 };
    static uint16_t k[RUN * STRIDE], v[RUN * STRIDE];
    static int32_t pos[RUN];
    for (int i = 0; i < RUN * STRIDE; i++) {
        k[i] = (uint16_t)(i * 31 + 7);
        v[i] = (uint16_t)(i * 17 + 3);
    }
    for (int i = 0; i < RUN; i++) pos[i] = 900 + 3 * i;
    static const int widths[] = { 1, 7, 32, 256 };
    for (size_t w = 0; w < sizeof widths / sizeof *widths; w++) {
        uint16_t dk[(RUN + 1) * STRIDE], dv[(RUN + 1) * STRIDE];
        int32_t dpos[RUN + 1];
        memset(dk, 0xee, sizeof dk);
        memset(dv, 0xee, sizeof dv);
        memset(dpos, 0xee, sizeof dpos);
        pf_move_job j = { k, v, pos, dk, dv, dpos, RUN, STRIDE };
        for (int t = 0; t < widths[w]; t++) pf_move(&j, t, widths[w]);
        cr_assert(!memcmp(dk, k, sizeof k) && !memcmp(dv, v, sizeof v) && !memcmp(dpos, pos, sizeof pos),
                  "width %d: the run differs", widths[w]);
        cr_assert(dk[RUN * STRIDE] == 0xeeee && dv[RUN * STRIDE] == 0xeeee && dpos[RUN] == (int32_t)0xeeeeeeee,
                  "width %d: written past the run", widths[w]);
    }
}
