/* test_act_mirror.c - the bookkeeping of device twins (kernels/act_mirror.c) with host memory standing
 * in for the device: what moves when, and that the host never reads a stale byte. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/act_mirror.h"

typedef struct fake {
    int allocs, waits, uploads, downloads;
    int pins, refuse_pins;
    /* late: downloads land on the host only at the next wait, with the bytes the device held when
     * they were issued (as copies ordered on a stream do at the latest) */
    int late;
    struct { void *dst; char bytes[1024]; size_t n; } q[8];
    int nq;
} fake;

static void *f_alloc(void *ud, size_t n)
{
    ((fake *)ud)->allocs++;
    return malloc(n);
}
static void f_release(void *ud, void *p)
{
    ((fake *)ud)->allocs--;
    free(p);
}
static void f_up(void *ud, void *d, const void *s, size_t n)
{
    ((fake *)ud)->uploads++;
    memcpy(d, s, n);
}
static void f_down(void *ud, void *d, const void *s, size_t n)
{
    fake *f = ud;
    f->downloads++;
    if (!f->late) {
        memcpy(d, s, n);
        return;
    }
    cr_assert(f->nq < 8 && n <= sizeof f->q[0].bytes);
    f->q[f->nq].dst = d;
    memcpy(f->q[f->nq].bytes, s, n);
    f->q[f->nq++].n = n;
}
static void f_wait(void *ud)
{
    fake *f = ud;
    for (int i = 0; i < f->nq; i++) memcpy(f->q[i].dst, f->q[i].bytes, f->q[i].n);
    f->nq = 0;
    f->waits++;
}
/* refuse_pins: the memory is locked already (another table's), so locking fails */
static int f_pin(void *ud, void *h, size_t n, int pin)
{
    fake *f = ud;
    if (pin && f->refuse_pins) return -1;
    f->pins += pin ? 1 : -1;
    return 0;
}

static void setup(am_table *t, fake *fk)
{
    memset(fk, 0, sizeof *fk);
    am_device d = { fk, f_alloc, f_release, f_up, f_down, f_wait, f_pin };
    am_init(t, &d);
}

Test(act_mirror, first_use_uploads_the_host_content_once)
{
    am_table t;
    fake fk;
    setup(&t, &fk);
    float x[64];
    for (int i = 0; i < 64; i++) x[i] = (float)i;
    cr_assert(am_bind(&t, x, sizeof x) == 0);
    cr_expect_eq(fk.pins, 1);
    const float *d = am_dev_in(&t, x + 8, 8 * sizeof(float));
    cr_assert(d);
    cr_expect_eq(d[0], 8.0f);
    cr_expect_eq(t.up_bytes, sizeof x);
    am_dev_in(&t, x, sizeof x);
    cr_expect_eq(t.up_bytes, sizeof x, "a second read uploaded again");
    float other[4];
    cr_expect_null(am_dev_in(&t, other, sizeof other), "an unbound range got a twin");
    cr_expect_eq(am_bind(&t, x + 4, 4), -1, "a range inside a bound buffer was bound again");
    am_free(&t);
    cr_expect_eq(fk.allocs, 0);
    cr_expect_eq(fk.pins, 0);
}

Test(act_mirror, a_blank_buffer_sends_nothing_until_the_host_writes_it)
{
    /* Rows only ops compute (CHESS's): bound blank, neither copy is newer, so an op writing a range
     * and another reading it send nothing up; the host reads what an op wrote, and what the host
     * writes goes up as it would in any buffer; the host copy is never page-locked. */
    am_table t;
    fake fk;
    setup(&t, &fk);
    float x[128];
    for (int i = 0; i < 128; i++) x[i] = -1.0f;
    cr_assert(am_bind_blank(&t, x, sizeof x, 0) == 0);
    cr_expect_eq(fk.pins, 0, "a blank buffer was page-locked");
    float *d = am_dev_out(&t, x + 32, 16 * sizeof(float));
    cr_assert(d);
    for (int i = 0; i < 16; i++) d[i] = (float)i;
    am_dev_in(&t, x + 32, 16 * sizeof(float));
    cr_expect_eq(t.up_bytes, 0, "%llu bytes sent for rows only ops write", (unsigned long long)t.up_bytes);
    am_range r = { x + 40, 4 * sizeof(float) };
    am_host_read(&t, &r, 1);
    cr_expect_eq(x[41], 9.0f);
    am_host_write(&t, x + 100, 2 * sizeof(float));
    x[100] = 5.0f;
    x[101] = 6.0f;
    const float *di = am_dev_in(&t, x + 100, 2 * sizeof(float));
    cr_expect_eq(di[1], 6.0f);
    cr_expect_eq(t.up_bytes, 2 * sizeof(float));
    cr_expect_eq(am_bind_blank(&t, x + 8, 4, 0), -1, "a range inside a bound buffer was bound again");
    am_unbind(&t, x);
    cr_expect_eq(fk.pins, 0, "a buffer never page-locked was unlocked");
    am_free(&t);
    cr_expect_eq(fk.allocs, 0);
}

Test(act_mirror, a_locked_blank_buffer_sends_nothing_when_an_op_first_writes_part_of_it)
{
    /* The forward pass's activations: page-locked, and an op's first write of a few rows sends
     * neither them nor the rest up (bound plainly, the whole buffer would go: the host's bytes
     * counted until then); the rows come back to the host when it reads them. */
    am_table t;
    fake fk;
    setup(&t, &fk);
    float x[256], y[256];
    cr_assert(am_bind_blank(&t, x, sizeof x, 1) == 0);
    cr_assert(am_bind(&t, y, sizeof y) == 0);
    cr_expect_eq(fk.pins, 2, "%d buffers page-locked of 2", fk.pins);
    float *dx = am_dev_out(&t, x, 8 * sizeof(float)), *dy = am_dev_out(&t, y, 8 * sizeof(float));
    cr_assert(dx && dy);
    cr_expect_eq(t.up_bytes, sizeof y, "%llu bytes sent: the plain buffer's %zu alone expected",
                 (unsigned long long)t.up_bytes, sizeof y);
    for (int i = 0; i < 8; i++) dx[i] = (float)(i + 1);
    am_range r = { x, 8 * sizeof(float) };
    am_host_read(&t, &r, 1);
    cr_expect_eq(x[7], 8.0f);
    am_unbind(&t, x);
    am_unbind(&t, y);
    cr_expect_eq(fk.pins, 0, "a page-locked buffer was left locked");
    am_free(&t);
    cr_expect_eq(fk.allocs, 0);
}

Test(act_mirror, host_reads_fetch_only_what_the_device_changed)
{
    am_table t;
    fake fk;
    setup(&t, &fk);
    float x[256] = { 0 };
    cr_assert(am_bind(&t, x, sizeof x) == 0);
    /* an op writes rows 0..15 on the device */
    float *d = am_dev_out(&t, x, 16 * sizeof(float));
    for (int i = 0; i < 16; i++) d[i] = 100.0f + (float)i;
    cr_expect_eq(x[3], 0.0f, "the host copy changed before anyone asked");
    am_range r = { x, 4 * sizeof(float) };
    am_host_read(&t, &r, 1);
    cr_expect_eq(x[3], 103.0f);
    cr_expect_eq(x[4], 0.0f, "bytes outside the read came back");
    cr_expect_eq(t.down_bytes, 4 * sizeof(float));
    cr_expect_eq(fk.waits, 1);
    /* the read covered the low end: only rows 4..15 are still newer on the device */
    r = (am_range){ x, 16 * sizeof(float) };
    am_host_read(&t, &r, 1);
    cr_expect_eq(t.down_bytes, 16 * sizeof(float));
    cr_expect_eq(x[15], 115.0f);
    /* nothing is newer on the device now: no copy and no wait */
    am_host_read(&t, &r, 1);
    cr_expect_eq(fk.waits, 2);
    cr_expect_eq(t.down_bytes, 16 * sizeof(float));
    am_free(&t);
}

Test(act_mirror, several_ranges_cost_one_wait)
{
    am_table t;
    fake fk;
    setup(&t, &fk);
    float k[32], v[32], q[32], u[8];
    cr_assert(am_bind(&t, k, sizeof k) == 0 && am_bind(&t, v, sizeof v) == 0 && am_bind(&t, q, sizeof q) == 0);
    am_dev_out(&t, k, 8 * sizeof(float));
    am_dev_out(&t, v, 8 * sizeof(float));
    am_range r[4] = { { k, 8 * sizeof(float) }, { v, 8 * sizeof(float) }, { q, 8 * sizeof(float) }, { u, sizeof u } };
    am_host_read(&t, r, 4);
    cr_expect_eq(fk.downloads, 2, "q was never written on the device, u is not bound");
    cr_expect_eq(fk.waits, 1);
    am_free(&t);
}

Test(act_mirror, a_host_write_keeps_the_device_bytes_it_does_not_cover)
{
    am_table t;
    fake fk;
    setup(&t, &fk);
    float x[64] = { 0 };
    cr_assert(am_bind(&t, x, sizeof x) == 0);
    float *d = am_dev_out(&t, x, 32 * sizeof(float));
    for (int i = 0; i < 32; i++) d[i] = 1.0f;
    /* the host rewrites rows 0..7: rows 8..31 must come back first, or they would be lost */
    am_host_write(&t, x, 8 * sizeof(float));
    for (int i = 0; i < 8; i++) x[i] = 2.0f;
    cr_expect_eq(x[20], 1.0f);
    cr_expect_eq(t.down_bytes, 24 * sizeof(float), "the rows about to be overwritten came back too");
    /* the next op sees the host's rows */
    const float *di = am_dev_in(&t, x, 32 * sizeof(float));
    cr_expect_eq(di[0], 2.0f);
    cr_expect_eq(di[20], 1.0f);
    /* a write in the middle of what the device changed brings back both sides */
    d = am_dev_out(&t, x, 32 * sizeof(float));
    for (int i = 0; i < 32; i++) d[i] = 3.0f;
    am_host_write(&t, x + 8, 8 * sizeof(float));
    cr_expect(x[7] == 3.0f && x[16] == 3.0f && x[31] == 3.0f);
    cr_expect_eq(t.down_bytes, 48 * sizeof(float));
    am_free(&t);
}

Test(act_mirror, a_host_that_reads_before_writing_announces_the_read)
{
    am_table t;
    fake fk;
    setup(&t, &fk);
    float x[8] = { 0 };
    cr_assert(am_bind(&t, x, sizeof x) == 0);
    float *d = am_dev_out(&t, x, sizeof x);
    for (int i = 0; i < 8; i++) d[i] = (float)i;
    am_range r = { x, sizeof x };
    am_host_read(&t, &r, 1);
    am_host_write(&t, x, sizeof x);
    x[3] += 1;
    cr_expect_eq(x[3], 4.0f);
    cr_expect_eq(((const float *)am_dev_in(&t, x, sizeof x))[3], 4.0f);
    am_free(&t);
}

Test(act_mirror, a_host_write_over_everything_the_device_changed_copies_nothing)
{
    am_table t;
    fake fk;
    setup(&t, &fk);
    float x[64] = { 0 };
    cr_assert(am_bind(&t, x, sizeof x) == 0);
    am_dev_in(&t, x, sizeof x);   /* first upload */
    am_dev_out(&t, x, 8 * sizeof(float));
    int waits = fk.waits;
    am_host_write(&t, x, 16 * sizeof(float));
    cr_expect_eq(fk.downloads, 0);
    /* the upload of the first use may still be in flight: the write waits for it */
    cr_expect_eq(fk.waits, waits + 1);
    /* a second write with nothing in flight waits for nothing */
    am_host_write(&t, x, 16 * sizeof(float));
    cr_expect_eq(fk.waits, waits + 1);
    am_free(&t);
}

Test(act_mirror, decode_like_traffic_moves_only_the_new_rows)
{
    /* a 512-row buffer used one row at a time, as a decode step uses the forward pass's scratch */
    am_table t;
    fake fk;
    setup(&t, &fk);
    enum { ROWS = 512, DIM = 64 };
    float *x = calloc(ROWS * DIM, sizeof(float));
    cr_assert(am_bind(&t, x, sizeof(float) * ROWS * DIM) == 0);
    am_host_write(&t, x, sizeof(float) * DIM);   /* the embedding row, written on the host */
    uint64_t up0 = 0;
    for (int step = 0; step < 10; step++) {
        am_host_write(&t, x, sizeof(float) * DIM);
        x[0] = (float)step;
        const float *d = am_dev_in(&t, x, sizeof(float) * DIM);
        cr_expect_eq(d[0], (float)step);
        if (step == 0) up0 = t.up_bytes;
        am_dev_out(&t, x, sizeof(float) * DIM);
        am_range r = { x, sizeof(float) * DIM };
        am_host_read(&t, &r, 1);
    }
    cr_expect_eq(t.up_bytes - up0, 9 * sizeof(float) * DIM, "each later step uploads one row");
    cr_expect_eq(t.down_bytes, 10 * sizeof(float) * DIM, "each step downloads one row");
    am_free(&t);
    free(x);
}

Test(act_mirror, a_range_straddling_a_buffer_end_is_a_bug, .signal = SIGABRT)
{
    am_table t;
    fake fk;
    setup(&t, &fk);
    float x[16];
    cr_assert(am_bind(&t, x + 4, 8 * sizeof(float)) == 0);
    am_dev_in(&t, x + 8, 8 * sizeof(float));
}

Test(act_mirror, unbind_releases_the_twin)
{
    am_table t;
    fake fk;
    setup(&t, &fk);
    float a[8], b[8];
    cr_assert(am_bind(&t, a, sizeof a) == 0 && am_bind(&t, b, sizeof b) == 0);
    cr_expect_eq(t.bytes, sizeof a + sizeof b);
    am_unbind(&t, a);
    cr_expect_eq(fk.allocs, 1);
    cr_expect_eq(t.bytes, sizeof b);
    cr_expect_null(am_dev_in(&t, a, sizeof a));
    cr_expect_not_null(am_dev_in(&t, b, sizeof b));
    am_free(&t);
    cr_expect_eq(fk.allocs, 0);
}

/* ---------------------------------------------------------------- prefetching */

/* A device whose downloads land late (fake.late), and x[0 .. n) bound to it, its twin holding v
 * (newer than the host's zeros). Returns the twin. */
static float *late_setup(am_table *t, fake *fk, float *x, size_t n, float v)
{
    setup(t, fk);
    fk->late = 1;
    for (size_t i = 0; i < n; i++) x[i] = 0;
    cr_assert(am_bind(t, x, n * sizeof(float)) == 0);
    float *d = am_dev_out(t, x, n * sizeof(float));
    for (size_t i = 0; i < n; i++) d[i] = v;
    return d;
}

Test(act_mirror, a_prefetch_comes_in_with_the_next_wait_and_costs_no_other)
{
    am_table t;
    fake l;
    float x[64];
    float *d = late_setup(&t, &l, x, 64, 0);
    for (int i = 0; i < 64; i++) d[i] = (float)i + 1;
    am_range r = { x + 8, 16 * sizeof(float) };
    am_host_prefetch(&t, &r, 1);
    cr_expect_eq(l.downloads, 1);
    cr_expect_eq(x[8], 0.0f, "the copy landed before any wait");
    /* the backend waits for its own reasons (a pick) and says so */
    f_wait(&l);
    am_waited(&t);
    am_host_read(&t, &r, 1);
    cr_expect_eq(l.waits, 1, "the read waited again");
    cr_expect_eq(l.downloads, 1, "the read copied again");
    for (int i = 8; i < 24; i++) cr_expect_eq(x[i], (float)i + 1);
    /* a read of the rest still copies it */
    am_range all = { x, sizeof x };
    am_host_read(&t, &all, 1);
    for (int i = 0; i < 64; i++) cr_expect_eq(x[i], (float)i + 1);
    am_free(&t);
}

Test(act_mirror, a_read_after_a_prefetch_without_a_wait_waits_and_does_not_copy_twice)
{
    am_table t;
    fake l;
    float x[32];
    late_setup(&t, &l, x, 32, 5.0f);
    am_range r = { x, sizeof x };
    am_host_prefetch(&t, &r, 1);
    am_host_read(&t, &r, 1);
    cr_expect_eq(l.downloads, 1);
    cr_expect_eq(l.waits, 1);
    cr_expect_eq(x[31], 5.0f);
    am_free(&t);
}

Test(act_mirror, an_op_writing_after_a_prefetch_cancels_it)
{
    am_table t;
    fake l;
    float x[32];
    float *d = late_setup(&t, &l, x, 32, 1.0f);
    am_range r = { x, sizeof x };
    am_host_prefetch(&t, &r, 1);
    d = am_dev_out(&t, x, sizeof x);   /* a later op rewrites the twin */
    for (int i = 0; i < 32; i++) d[i] = 2.0f;
    f_wait(&l);
    am_waited(&t);   /* the stale copy landed */
    cr_expect_eq(x[0], 1.0f);
    am_host_read(&t, &r, 1);
    for (int i = 0; i < 32; i++) cr_expect_eq(x[i], 2.0f, "a cancelled fetch counted as current");
    am_free(&t);
}

Test(act_mirror, a_host_write_or_unbind_waits_for_a_prefetch_in_flight)
{
    am_table t;
    fake l;
    float x[32];
    late_setup(&t, &l, x, 32, 3.0f);
    f_wait(&l);   /* the first upload done: only the fetch below can make the write wait */
    am_waited(&t);
    am_range r = { x, sizeof x };
    am_host_prefetch(&t, &r, 1);
    am_host_write(&t, x, sizeof x);
    cr_expect_eq(l.nq, 0, "the host writes while a copy into its bytes is in flight");
    for (int i = 0; i < 32; i++) x[i] = 7.0f;
    f_wait(&l);
    cr_expect_eq(x[0], 7.0f, "the write was clobbered");
    /* unbinding with a fetch in flight waits too */
    am_dev_out(&t, x, sizeof x);
    f_wait(&l);
    am_waited(&t);
    am_host_prefetch(&t, &r, 1);
    am_unbind(&t, x);
    cr_expect_eq(l.nq, 0, "a copy was left in flight into a buffer being freed");
    am_free(&t);
}

/* A fetch that landed in the middle of what is newer on the device is remembered apart; an op that
 * writes the twin afterwards makes those bytes stale again. */
Test(act_mirror, an_op_writing_over_a_fetched_hole_makes_it_stale_again)
{
    am_table t;
    fake l;
    float x[64];
    float *d = late_setup(&t, &l, x, 64, 1.0f);
    f_wait(&l);
    am_waited(&t);
    am_range mid = { x + 8, 16 * sizeof(float) };
    am_host_prefetch(&t, &mid, 1);
    f_wait(&l);
    am_waited(&t);
    am_host_read(&t, &mid, 1);
    cr_expect_eq(l.downloads, 1, "a fetched hole was copied again");
    cr_expect_eq(x[8], 1.0f);
    d = am_dev_out(&t, x + 8, 16 * sizeof(float));
    for (int i = 0; i < 16; i++) d[i] = 2.0f;
    am_host_read(&t, &mid, 1);
    for (int i = 8; i < 24; i++) cr_expect_eq(x[i], 2.0f, "the hole's old bytes were taken as current");
    am_free(&t);
}

Test(act_mirror, every_change_of_device_bytes_is_counted)
{
    /* The CUDA backend keeps a product input's 8-bit codes while dev_changes stays the same: every
     * way a twin's device bytes can change must count, and reads and host reads must not (else
     * the codes would be made again for nothing). */
    am_table t;
    fake fk;
    setup(&t, &fk);
    float x[64], y[64];
    for (int i = 0; i < 64; i++) x[i] = y[i] = (float)i;
    uint64_t c = t.dev_changes;
    cr_assert(am_bind(&t, x, sizeof x) == 0);
    cr_expect_gt(t.dev_changes, c, "a bind was not counted");
    c = t.dev_changes;
    am_dev_in(&t, x, sizeof x);   /* the first use uploads the host's bytes */
    cr_expect_gt(t.dev_changes, c, "an upload was not counted");
    c = t.dev_changes;
    am_dev_in(&t, x, sizeof x);
    am_range r = { x, sizeof x };
    am_host_read(&t, &r, 1);
    am_host_prefetch(&t, &r, 1);
    cr_expect_eq(t.dev_changes, c, "reads changed the count");
    float *d = am_dev_out(&t, x + 4, 4 * sizeof(float));
    cr_expect_gt(t.dev_changes, c, "an op's write was not counted");
    d[0] = 1.0f;
    c = t.dev_changes;
    am_host_write(&t, x, 8 * sizeof(float));   /* announced: no device bytes change yet */
    cr_expect_eq(t.dev_changes, c, "an announced host write changed the count before its upload");
    x[0] = 7.0f;
    am_dev_in(&t, x, sizeof(float));
    cr_expect_gt(t.dev_changes, c, "the upload of a host write was not counted");
    c = t.dev_changes;
    am_unbind(&t, x);
    cr_expect_gt(t.dev_changes, c, "an unbind was not counted");
    c = t.dev_changes;
    cr_assert(am_bind_blank(&t, y, sizeof y, 0) == 0);
    cr_expect_gt(t.dev_changes, c, "a blank bind was not counted");
    am_free(&t);
}

Test(act_mirror, a_buffer_it_could_not_lock_is_not_unlocked)
{
    /* Two backends binding the same host memory (gpu_bench does): the second's lock fails, and its
     * unbind must not unlock the memory under the first. */
    am_table t;
    fake fk;
    setup(&t, &fk);
    float x[64];
    fk.refuse_pins = 1;
    cr_assert(am_bind(&t, x, sizeof x) == 0);
    cr_expect_eq(fk.pins, 0);
    am_unbind(&t, x);
    cr_expect_eq(fk.pins, 0, "a lock this table never took was released");
    fk.refuse_pins = 0;
    cr_assert(am_bind(&t, x, sizeof x) == 0);
    cr_expect_eq(fk.pins, 1);
    am_free(&t);
    cr_expect_eq(fk.pins, 0, "the table's own lock was kept");
}

/* am_pinned says which ranges a device may copy as page-locked memory (a recorded copy reads or
 * writes them when it runs): those of buffers this table locked, not blank ones, not ones whose
 * lock failed (another table's), not unbound ranges. */
Test(act_mirror, pinned_names_only_the_buffers_this_table_locked)
{
    am_table t;
    fake fk;
    setup(&t, &fk);
    float a[64], b[64], c[64], d[64];
    cr_assert(am_bind(&t, a, sizeof a) == 0);
    cr_assert(am_bind_blank(&t, b, sizeof b, 0) == 0);
    fk.refuse_pins = 1;
    cr_assert(am_bind(&t, c, sizeof c) == 0);
    fk.refuse_pins = 0;
    cr_expect(am_pinned(&t, a, sizeof a));
    cr_expect(am_pinned(&t, a + 60, 4 * sizeof(float)), "the end of a locked buffer");
    cr_expect_not(am_pinned(&t, b, sizeof b), "a blank buffer");
    cr_expect_not(am_pinned(&t, c + 8, 8 * sizeof(float)), "a buffer whose lock failed");
    cr_expect_not(am_pinned(&t, d, sizeof d), "an unbound range");
    am_unbind(&t, a);
    cr_expect_not(am_pinned(&t, a, sizeof a), "an unbound buffer");
    am_free(&t);
}
