/* test_page_copies.c - the CUDA backend's table of device copies of KV pages (kernels/page_copies.c),
 * with host memory standing in for the device: copies equal their pages after appends (only the new
 * rows move), rewrites under a new generation (the page moves whole), growth past the storage, a few
 * thousand pages (the table rehashes), idle copies are freed and in-use ones kept, and running out of
 * device memory leaves the table as it was. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/page_copies.h"

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
