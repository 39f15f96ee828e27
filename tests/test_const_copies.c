/* test_const_copies.c - the CUDA backend's device copies of small constant inputs (norm weights,
 * kernels/const_copies.c), with host memory standing in for the device: a few hundred inputs
 * (the table grows twice) keep their copies, unchanged bytes are not sent again, changed bytes are,
 * fewer bytes reuse a copy and more take a new one, running out of device memory or a refused
 * upload is reported and mended by the next call, and freeing releases every copy exactly once.
 * Before this table was its own module, its growth in backend_cuda.cu also freed an unrelated
 * buffer of the backend (the deferred decode step's page list), which the next step wrote and
 * cuda_destroy freed again. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/const_copies.h"

enum { MAX_LIVE = 4096 };

typedef struct fake_dev {
    void *live[MAX_LIVE];   /* the allocations not yet released */
    int n_live;
    int64_t fail_after;     /* allocations that succeed before the device is "full" (-1: never) */
    int64_t allocs;
    int fail_uploads;
} fake_dev;

static void *f_alloc(void *ud, size_t bytes)
{
    fake_dev *d = ud;
    if (d->fail_after >= 0 && d->allocs >= d->fail_after) return NULL;
    cr_assert_lt(d->n_live, MAX_LIVE);
    void *p = malloc(bytes);
    cr_assert(p);
    d->allocs++;
    d->live[d->n_live++] = p;
    return p;
}

/* A release of something not allocated, or released twice, fails the test. */
static void f_release(void *ud, void *p)
{
    fake_dev *d = ud;
    for (int i = 0; i < d->n_live; i++)
        if (d->live[i] == p) {
            d->live[i] = d->live[--d->n_live];
            free(p);
            return;
        }
    cr_assert_fail("released %p, which is not a live device allocation", p);
}

static int f_upload(void *ud, void *dst, const void *src, size_t bytes)
{
    fake_dev *d = ud;
    if (d->fail_uploads) return -1;
    memcpy(dst, src, bytes);
    return 0;
}

static cc_table table_on(fake_dev *d)
{
    cc_table t;
    cc_device dev = { d, f_alloc, f_release, f_upload };
    cc_init(&t, &dev);
    return t;
}

enum { N_INPUTS = 300, DIM = 40 };

Test(const_copies, every_copy_survives_the_table_growing)
{
    static fake_dev d = { .fail_after = -1 };
    static float w[N_INPUTS][DIM];
    const void *dev[N_INPUTS];
    cc_table t = table_on(&d);
    enum cc_status st;
    for (int i = 0; i < N_INPUTS; i++) {
        for (int j = 0; j < DIM; j++) w[i][j] = (float)(i * DIM + j) * 0.25f;
        dev[i] = cc_get(&t, w[i], sizeof w[i], &st);
        cr_assert(dev[i] && st == CC_OK, "input %d", i);
        cr_assert(!memcmp(dev[i], w[i], sizeof w[i]), "input %d: the copy differs", i);
    }
    cr_expect_geq(t.cap, 2 * N_INPUTS, "the table grew past %d inputs (%d slots)", N_INPUTS, t.cap);
    cr_expect_eq(t.uploads, N_INPUTS);
    cr_expect_eq(t.bytes, (uint64_t)N_INPUTS * sizeof w[0]);
    /* every input again: the same copies, nothing sent */
    for (int i = 0; i < N_INPUTS; i++) {
        cr_expect_eq(cc_get(&t, w[i], sizeof w[i], &st), dev[i], "input %d moved", i);
        cr_expect(!memcmp(dev[i], w[i], sizeof w[i]), "input %d: the copy changed", i);
    }
    cr_expect_eq(t.uploads, N_INPUTS, "unchanged inputs were sent again");
    cr_expect_eq(d.n_live, N_INPUTS);
    cc_free(&t);
    cr_expect_eq(d.n_live, 0, "%d copies not released", d.n_live);
}

Test(const_copies, changed_bytes_are_sent_fewer_reuse_the_copy_and_more_take_a_new_one)
{
    fake_dev d = { .fail_after = -1 };
    float w[DIM];
    for (int j = 0; j < DIM; j++) w[j] = (float)j;
    cc_table t = table_on(&d);
    enum cc_status st;
    const float *c = cc_get(&t, w, sizeof w, &st);
    cr_assert(c);
    w[7] = -3.5f;
    cr_expect_eq(cc_get(&t, w, sizeof w, &st), c, "changed bytes move the copy");
    cr_expect_eq(c[7], -3.5f);
    cr_expect_eq(t.uploads, 2);
    /* the first bytes of the copy, unchanged: the copy as it is (a batch's positions: all rows for
     * qk_rope, the first row for the first sequence's attention) */
    cr_expect_eq(cc_get(&t, w, sizeof w / 2, &st), c);
    cr_expect_eq(t.uploads, 2, "the unchanged first bytes were sent again");
    cr_expect_eq(cc_get(&t, w, sizeof w, &st), c);
    cr_expect_eq(t.uploads, 2, "the whole copy was sent again after a shorter use of it");
    /* a step's positions: a prompt's chunk, then one token: the same allocation, no release (on a
     * GPU a release waits for the device) */
    w[0] = 11.0f;
    const float *c2 = cc_get(&t, w, sizeof w / 2, &st);
    cr_assert(c2 && st == CC_OK);
    cr_expect_eq(c2, c, "fewer bytes took a new copy");
    cr_expect_eq(d.allocs, 1);
    cr_expect_eq(c2[0], 11.0f, "fewer bytes were not sent");
    cr_expect_eq(t.uploads, 3);
    cr_expect_eq(cc_get(&t, w, sizeof w / 2, &st), c);
    cr_expect_eq(t.uploads, 3, "the same fewer bytes were sent again");
    cr_expect_eq(t.bytes, sizeof w, "the device bytes held are the allocation's");
    /* the full length again: same bytes past the half, but they were not compared: sent */
    cr_expect_eq(cc_get(&t, w, sizeof w, &st), c);
    cr_expect_eq(t.uploads, 4);
    cr_expect_eq(d.allocs, 1);
    cc_free(&t);
    cr_expect_eq(d.n_live, 0);
}

Test(const_copies, more_bytes_than_the_room_take_a_new_copy)
{
    fake_dev d = { .fail_after = -1 };
    static float w[2 * DIM];
    for (int j = 0; j < 2 * DIM; j++) w[j] = (float)j;
    cc_table t = table_on(&d);
    enum cc_status st;
    const float *c = cc_get(&t, w, sizeof(float) * DIM, &st);
    cr_assert(c);
    const float *c2 = cc_get(&t, w, sizeof w, &st);
    cr_assert(c2 && st == CC_OK);
    cr_expect(!memcmp(c2, w, sizeof w));
    cr_expect_eq(d.allocs, 2);
    cr_expect_eq(d.n_live, 1, "the smaller copy was not released");
    cr_expect_eq(t.bytes, sizeof w);
    cc_free(&t);
    cr_expect_eq(d.n_live, 0);
}

Test(const_copies, out_of_device_memory_and_refused_uploads_are_mended_next_time)
{
    fake_dev d = { .fail_after = 0 };
    float w[DIM], u[DIM];
    for (int j = 0; j < DIM; j++) w[j] = u[j] = (float)j + 0.5f;
    cc_table t = table_on(&d);
    enum cc_status st;
    cr_expect_null(cc_get(&t, w, sizeof w, &st));
    cr_expect_eq(st, CC_NO_DEVICE_MEMORY);
    cr_expect_eq(t.bytes, 0);
    d.fail_after = -1;
    const float *c = cc_get(&t, w, sizeof w, &st);
    cr_assert(c && st == CC_OK, "the next call after memory came back");
    cr_expect(!memcmp(c, w, sizeof w));
    /* an upload the device refused: the next call with the same bytes sends them */
    w[0] = 99.0f;
    d.fail_uploads = 1;
    cr_expect_null(cc_get(&t, w, sizeof w, &st));
    cr_expect_eq(st, CC_NOT_SENT);
    d.fail_uploads = 0;
    cr_expect_eq(cc_get(&t, w, sizeof w, &st), c);
    cr_expect_eq(c[0], 99.0f, "the refused bytes were not sent again");
    /* an input whose first allocation failed, then many others (growth moves the tombstone too) */
    d.fail_after = d.allocs;
    cr_expect_null(cc_get(&t, u, sizeof u, &st));
    d.fail_after = -1;
    static float more[N_INPUTS][4];
    for (int i = 0; i < N_INPUTS; i++) cr_assert(cc_get(&t, more[i], sizeof more[i], &st));
    const float *cu = cc_get(&t, u, sizeof u, &st);
    cr_assert(cu && st == CC_OK);
    cr_expect(!memcmp(cu, u, sizeof u));
    cc_free(&t);
    cr_expect_eq(d.n_live, 0);
}

/* cc_claim: new or changed bytes are the caller's to write on the device (a decode step's positions,
 * which qk_rope's launch carries and writes): nothing is sent, the copy counts as holding them, so a
 * cc_get of the same bytes after it (attention's) sends nothing; unchanged bytes ask for no write; a
 * claim whose write did not happen (cc_unwritten) is sent by the next cc_get, or asked of the next
 * claim again. */
Test(const_copies, claimed_bytes_are_written_by_the_caller_and_not_sent)
{
    fake_dev d = { .fail_after = -1 };
    int32_t pos[4] = { 100, 101, 102, 103 };
    cc_table t = table_on(&d);
    enum cc_status st;
    int write = -1;
    int32_t *c = (int32_t *)cc_claim(&t, pos, sizeof pos, &write, &st);
    cr_assert(c && st == CC_OK);
    cr_expect_eq(write, 1, "a new copy is the caller's to write");
    cr_expect_eq(t.uploads, 0, "a claim sent its bytes");
    memcpy(c, pos, sizeof pos);   /* the caller's launch writes them */
    cr_expect_eq(cc_get(&t, pos, sizeof pos, &st), c);
    cr_expect_eq(t.uploads, 0, "the claimed bytes were sent again by cc_get");
    cr_expect_eq(cc_claim(&t, pos, sizeof pos, &write, &st), c);
    cr_expect_eq(write, 0, "unchanged bytes asked for a write");
    /* the next step: one position, changed */
    pos[0] = 104;
    cr_expect_eq(cc_claim(&t, pos, sizeof pos[0], &write, &st), c);
    cr_expect_eq(write, 1);
    c[0] = 104;
    cr_expect_eq(cc_get(&t, pos, sizeof pos[0], &st), c);
    cr_expect_eq(t.uploads, 0);
    /* a claim whose launch failed: the next cc_get sends, the next claim asks again */
    pos[0] = 105;
    cr_expect_eq(cc_claim(&t, pos, sizeof pos[0], &write, &st), c);
    cr_expect_eq(write, 1);
    cc_unwritten(&t, pos);
    cr_expect_eq(cc_claim(&t, pos, sizeof pos[0], &write, &st), c);
    cr_expect_eq(write, 1, "an unwritten claim was taken as written");
    cc_unwritten(&t, pos);
    cr_expect_eq(cc_get(&t, pos, sizeof pos[0], &st), c);
    cr_expect_eq(t.uploads, 1, "an unwritten claim was not sent by the next cc_get");
    cr_expect_eq(c[0], 105);
    cc_unwritten(&t, &write);   /* a key never claimed: nothing */
    cr_expect_eq(cc_get(&t, pos, sizeof pos[0], &st), c);
    cr_expect_eq(t.uploads, 1);
    cc_free(&t);
    cr_expect_eq(d.n_live, 0);
}

Test(const_copies, fixed_bytes_are_not_compared_and_other_keys_still_are)
{
    static fake_dev d = { .fail_after = -1 };
    static float w[DIM], x[DIM];
    for (int j = 0; j < DIM; j++) w[j] = x[j] = (float)j;
    cc_table t = table_on(&d);
    enum cc_status st;
    const float *dw = cc_fix(&t, w, sizeof w, &st), *dx = cc_get(&t, x, sizeof x, &st);
    cr_assert(dw && dx && t.uploads == 2);
    cr_expect(!memcmp(dw, w, sizeof w), "fixed bytes are sent once");
    /* a caller that broke its word: the fixed copy is not looked at again, the other is */
    w[3] = x[3] = -1.0f;
    cr_expect_eq(cc_get(&t, w, sizeof w, &st), dw);
    cr_expect_eq(t.uploads, 2, "fixed bytes are not compared");
    cr_expect_eq(dw[3], 3.0f);
    cr_expect_eq(cc_get(&t, x, sizeof x, &st), dx);
    cr_expect_eq(t.uploads, 3, "bytes not fixed are compared and sent");
    cr_expect_eq(dx[3], -1.0f);
    cr_expect_eq(cc_get(&t, w, sizeof w / 2, &st), dw);
    cr_expect_eq(t.uploads, 3, "fewer bytes of a fixed copy serve as they are");
    cc_free(&t);
    cr_expect_eq(d.n_live, 0);
}

/* Only the bytes cc_fix was given are taken on trust: a longer call under the key, a fix of fewer
 * bytes than a copy already holds, and a fixed copy a failed upload left stale are all compared
 * (and sent) as cc_get's. */
Test(const_copies, only_the_fixed_bytes_go_uncompared)
{
    static fake_dev d = { .fail_after = -1 };
    static float a[2 * DIM], b[2 * DIM];
    for (int j = 0; j < 2 * DIM; j++) a[j] = b[j] = (float)j;
    cc_table t = table_on(&d);
    enum cc_status st;
    /* fixed on its first half, then asked for the whole: the tail is compared at every call */
    cr_assert(cc_fix(&t, a, sizeof a / 2, &st) && t.uploads == 1);
    const float *da = cc_get(&t, a, sizeof a, &st);
    cr_assert(da && t.uploads == 2, "more bytes than fixed are sent");
    a[DIM + 3] = -5.0f;
    cr_expect(cc_get(&t, a, sizeof a, &st) == da && t.uploads == 3 && da[DIM + 3] == -5.0f,
              "a change past the fixed bytes is sent");
    a[1] = -7.0f;   /* inside the fixed bytes: not looked at by a call for them */
    cr_expect(cc_get(&t, a, sizeof a / 2, &st) == da && t.uploads == 3 && da[1] == 1.0f);
    /* a copy of the whole, then a fix of its first quarter: the rest is still compared */
    const float *db = cc_get(&t, b, sizeof b, &st);
    cr_assert(db && t.uploads == 4);
    cr_assert(cc_fix(&t, b, sizeof b / 4, &st) == db && t.uploads == 4);
    b[DIM + 1] = -9.0f;
    cr_expect(cc_get(&t, b, sizeof b, &st) == db && t.uploads == 5 && db[DIM + 1] == -9.0f,
              "a fix of fewer bytes does not cover the rest of the copy");
    /* a longer call whose upload fails leaves the copy stale: the fixed bytes are sent again too */
    d.fail_uploads = 1;
    b[DIM + 2] = -11.0f;
    cr_expect_null(cc_get(&t, b, sizeof b, &st));
    cr_expect_eq(st, CC_NOT_SENT);
    d.fail_uploads = 0;
    cr_expect(cc_get(&t, b, sizeof b / 4, &st) == db && st == CC_OK && t.uploads == 6,
              "a stale fixed copy is sent at its next use");
    /* a cc_fix whose upload failed fixed nothing: the key is compared later */
    static float z[DIM];
    d.fail_uploads = 1;
    cr_expect_null(cc_fix(&t, z, sizeof z, &st));
    cr_expect_eq(st, CC_NOT_SENT);
    d.fail_uploads = 0;
    z[0] = 5.0f;
    const float *dz = cc_get(&t, z, sizeof z, &st);
    cr_assert(dz && st == CC_OK && dz[0] == 5.0f && t.uploads == 7, "a stale copy is sent");
    z[1] = 6.0f;
    cr_expect_eq(cc_get(&t, z, sizeof z, &st), dz);
    cr_expect(t.uploads == 8 && dz[1] == 6.0f, "not fixed: its cc_fix was not sent, so it never was");
    cc_free(&t);
    cr_expect_eq(d.n_live, 0);
}
