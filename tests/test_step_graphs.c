/* test_step_graphs.c - recorded decode work replayed as graphs (kernels/step_graphs.c), with a
 * recorder standing in for the device: what a segment recorded runs once, in order, by the graph
 * its shape kept (updated in place) or by a new one; shapes alternate within the cache, a cycle of
 * more shapes than it holds gives up; every failure of the device turns graphs off and says the
 * work was lost, and nothing the device made is leaked or released twice. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/step_graphs.h"

enum { MAX_OPS = 128, MAX_RUN = 16384 };

typedef struct f_graph {
    int ops[MAX_OPS];   /* the work recorded: an integer an operation */
    int n;
    unsigned shape;     /* what an update needs to match (the fake's notion of topology) */
} f_graph;

typedef struct fake {
    int recording;
    f_graph cur;        /* what the open recording holds */
    int live_graphs, live_execs;
    int ran[MAX_RUN];   /* every operation the device ran, in order */
    int n_ran;
    int fail_begin, fail_end, fail_inst, fail_launch, refuse_update;
    int max_execs;      /* > 0: a build fails while that many executable graphs live (the device's memory) */
    int updates, instantiations;
} fake;

static int f_begin(void *ud)
{
    fake *f = ud;
    cr_assert(!f->recording, "recording began twice");
    if (f->fail_begin) return -1;
    f->recording = 1;
    f->cur.n = 0;
    f->cur.shape = 0;
    return 0;
}

static int f_end(void *ud, void **graph)
{
    fake *f = ud;
    cr_assert(f->recording, "a recording ended that had not begun");
    f->recording = 0;
    if (f->fail_end) return -1;
    f_graph *g = malloc(sizeof *g);
    cr_assert(g);
    *g = f->cur;
    f->live_graphs++;
    *graph = g;
    return 0;
}

static int f_update(void *ud, void *exec, void *graph)
{
    fake *f = ud;
    f_graph *e = exec, *g = graph;
    if (f->refuse_update || e->shape != g->shape || e->n != g->n) return -1;
    *e = *g;
    f->updates++;
    return 0;
}

static void *f_inst(void *ud, void *graph)
{
    fake *f = ud;
    if (f->fail_inst || (f->max_execs > 0 && f->live_execs >= f->max_execs)) return NULL;
    f_graph *e = malloc(sizeof *e);
    cr_assert(e);
    *e = *(f_graph *)graph;
    f->live_execs++;
    f->instantiations++;
    return e;
}

static int f_launch(void *ud, void *exec)
{
    fake *f = ud;
    if (f->fail_launch) return -1;
    f_graph *e = exec;
    for (int i = 0; i < e->n; i++) {
        cr_assert_lt(f->n_ran, MAX_RUN);
        f->ran[f->n_ran++] = e->ops[i];
    }
    return 0;
}

static void f_destroy_graph(void *ud, void *graph)
{
    fake *f = ud;
    cr_assert_gt(f->live_graphs, 0, "a graph released twice");
    f->live_graphs--;
    free(graph);
}

static void f_destroy_exec(void *ud, void *exec)
{
    fake *f = ud;
    cr_assert_gt(f->live_execs, 0, "an executable graph released twice");
    f->live_execs--;
    free(exec);
}

static sg_table table_on(fake *f, int on, int split)
{
    sg_device d = { f, f_begin, f_end, f_update, f_inst, f_launch, f_destroy_graph, f_destroy_exec };
    sg_table t;
    sg_init(&t, &d, on, split);
    return t;
}

/* Call sites: the signature is their addresses. */
static const char *const SITE[] = { "kernel a", "kernel b", "copy c", "kernel d", "kernel e", "copy f",
                                    "kernel g", "kernel h", "kernel i", "kernel j" };

/* What the backend does for one issued call: recorded when recording (the value op, at site s),
 * else run at once. The shape of the recording follows the sites, as a real graph's topology
 * follows its kernels. */
static void issue(sg_table *t, fake *f, int s, int op)
{
    if (f->recording) {
        cr_assert_lt(f->cur.n, MAX_OPS);
        f->cur.ops[f->cur.n++] = op;
        f->cur.shape = f->cur.shape * 31u + (unsigned)s + 1u;
    } else {
        cr_assert_lt(f->n_ran, MAX_RUN);
        f->ran[f->n_ran++] = op;
    }
    sg_note(t, SITE[s]);
}

/* A step of `n` calls at the sites of `shape` (a digit string), its ops numbered from *next. */
static void step(sg_table *t, fake *f, const char *shape, int *next)
{
    cr_assert_eq(sg_begin(t), 0);
    for (const char *c = shape; *c; c++) issue(t, f, *c - '0', (*next)++);
    cr_assert_eq(sg_flush(t), 0);
}

static void assert_ran_in_order(const fake *f, int n)
{
    cr_assert_eq(f->n_ran, n, "%d operations ran, %d issued", f->n_ran, n);
    for (int i = 0; i < n; i++) cr_assert_eq(f->ran[i], i, "operation %d ran as the %d-th", f->ran[i], i);
}

Test(step_graphs, off_records_nothing_and_issues_as_before)
{
    fake f = { 0 };
    sg_table t = table_on(&f, 0, 0);
    int next = 0;
    for (int k = 0; k < 5; k++) step(&t, &f, "0123", &next);
    cr_assert_eq(f.live_graphs + f.live_execs + f.updates + f.instantiations, 0);
    cr_assert_eq(t.segments, 0);
    assert_ran_in_order(&f, next);
    sg_free(&t);
}

Test(step_graphs, a_repeated_step_builds_once_then_updates_its_graph)
{
    fake f = { 0 };
    sg_table t = table_on(&f, 1, 0);
    int next = 0;
    for (int k = 0; k < 600; k++) step(&t, &f, "01230123456", &next);
    assert_ran_in_order(&f, next);
    cr_assert_eq(t.builds, 1);
    cr_assert_eq(t.updates, 599);
    cr_assert_eq(f.updates, 599);
    cr_assert_eq(t.segments, 600);
    cr_assert_eq(t.calls, 600 * 11);
    cr_assert_eq(f.live_graphs, 0, "a recorded graph kept after its segment ran");
    cr_assert_eq(f.live_execs, 1);
    cr_assert(t.on);
    sg_free(&t);
    cr_assert_eq(f.live_execs, 0);
}

Test(step_graphs, alternating_shapes_each_keep_their_graph)
{
    fake f = { 0 };
    sg_table t = table_on(&f, 1, 0);
    const char *shapes[] = { "0123", "01234", "9", "4321", "1032" };   /* the last two: same sites, other order */
    int next = 0;
    for (int k = 0; k < 40; k++) step(&t, &f, shapes[k % 5], &next);
    assert_ran_in_order(&f, next);
    cr_assert_eq(t.builds, 5, "%llu builds for 5 shapes", (unsigned long long)t.builds);
    cr_assert_eq(t.updates, 35);
    cr_assert_eq(t.refused, 0, "a shape found another's graph");
    cr_assert(t.on);
    sg_free(&t);
    cr_assert_eq(f.live_execs + f.live_graphs, 0);
}

/* Shape k of a family: the digits of k + 10 as sites, a distinct sequence for each k. */
static const char *shape_no(int k, char *buf)
{
    snprintf(buf, 16, "%d", k + 10);
    return buf;
}

Test(step_graphs, more_shapes_than_the_cache_build_until_it_gives_up)
{
    fake f = { 0 };
    sg_table t = table_on(&f, 1, 0);
    /* SG_CACHE + 1 shapes in a cycle: the least recently used is always the one coming next */
    char buf[16];
    int next = 0, k = 0;
    while (t.on) {
        cr_assert_lt(k, 10 * SG_SETTLE);
        step(&t, &f, shape_no(k++ % (SG_CACHE + 1), buf), &next);
    }
    assert_ran_in_order(&f, next);
    cr_assert(t.gave_up);
    cr_assert_eq(t.segments, SG_SETTLE, "gave up after %llu segments", (unsigned long long)t.segments);
    cr_assert_eq(t.builds, SG_SETTLE);
    cr_assert_eq(f.live_execs, 0, "graphs kept after giving up");
    for (int j = 0; j < 3; j++) step(&t, &f, "0123", &next);   /* off: issued as before */
    assert_ran_in_order(&f, next);
    cr_assert_eq(t.segments, SG_SETTLE);
    sg_free(&t);
    cr_assert_eq(f.live_execs + f.live_graphs, 0);
}

/* A step split into more shapes than a few (fewer than the cache holds), repeated: each shape built
 * once, then updated, for many windows; never given up. */
Test(step_graphs, a_step_of_many_shapes_keeps_them_all)
{
    fake f = { 0 };
    sg_table t = table_on(&f, 1, 0);
    char buf[16];
    int next = 0;
    const int per = SG_CACHE - 4;
    for (int k = 0; k < 3 * SG_SETTLE; k++) step(&t, &f, shape_no(k % per, buf), &next);
    assert_ran_in_order(&f, next);
    cr_assert(t.on && !t.gave_up);
    cr_assert_eq(t.builds, (uint64_t)per);
    cr_assert_eq(t.updates, (uint64_t)(3 * SG_SETTLE - per));
    sg_free(&t);
    cr_assert_eq(f.live_execs + f.live_graphs, 0);
}

/* A build the device refuses for want of memory while other graphs are kept: they are released
 * and the build tried again; the work runs, nothing is lost or leaked. */
Test(step_graphs, a_build_short_of_memory_releases_the_other_graphs_and_tries_again)
{
    fake f = { 0 };
    sg_table t = table_on(&f, 1, 0);
    char buf[16];
    int next = 0;
    for (int k = 0; k < 5; k++) step(&t, &f, shape_no(k, buf), &next);
    cr_assert_eq(f.live_execs, 5);
    f.max_execs = 5;   /* the device holds five: the sixth build fails until the others go */
    step(&t, &f, shape_no(5, buf), &next);
    assert_ran_in_order(&f, next);
    cr_assert(t.on);
    cr_assert_eq(t.failures, 0);
    cr_assert_eq(f.live_execs, 1, "%d graphs kept after the retry", f.live_execs);
    step(&t, &f, shape_no(5, buf), &next);   /* the one kept is updated */
    cr_assert_eq(t.updates, 1);
    f.max_execs = 0;
    f.fail_inst = 1;   /* refused even alone: a failure, graphs off */
    cr_assert_eq(sg_begin(&t), 0);
    issue(&t, &f, 0, next++);
    cr_assert_eq(sg_flush(&t), -1);
    cr_assert_not(t.on);
    cr_assert_eq(f.live_execs + f.live_graphs, 0);
    sg_free(&t);
}

Test(step_graphs, a_refused_update_builds_in_the_same_slot)
{
    fake f = { 0 };
    sg_table t = table_on(&f, 1, 0);
    int next = 0;
    step(&t, &f, "012", &next);
    f.refuse_update = 1;
    step(&t, &f, "012", &next);
    step(&t, &f, "012", &next);
    f.refuse_update = 0;
    step(&t, &f, "012", &next);
    assert_ran_in_order(&f, next);
    cr_assert_eq(t.refused, 2);
    cr_assert_eq(t.builds, 3);
    cr_assert_eq(t.updates, 1);
    cr_assert_eq(f.live_execs, 1, "a refused graph's old executable kept beside the new one");
    sg_free(&t);
    cr_assert_eq(f.live_execs + f.live_graphs, 0);
}

Test(step_graphs, the_signature_is_the_sites_in_order_and_their_count)
{
    fake f = { 0 };
    sg_table t = table_on(&f, 1, 0);
    int next = 0;
    step(&t, &f, "01", &next);
    step(&t, &f, "10", &next);
    step(&t, &f, "011", &next);
    step(&t, &f, "0", &next);
    cr_assert_eq(t.builds, 4);
    cr_assert_eq(t.refused, 0);
    step(&t, &f, "10", &next);
    cr_assert_eq(t.builds, 4);
    cr_assert_eq(t.updates, 1);
    assert_ran_in_order(&f, next);
    sg_free(&t);
}

Test(step_graphs, split_ends_a_segment_after_its_calls_and_the_work_stays_in_order)
{
    fake f = { 0 };
    sg_table t = table_on(&f, 1, 4);
    int next = 0;
    for (int k = 0; k < 6; k++) {
        /* the backend's rule at an op's start: end the segment once it is long enough, then record on */
        cr_assert_eq(sg_begin(&t), 0);
        for (int c = 0; c < 10; c++) {
            if (sg_split(&t)) {
                cr_assert_eq(sg_flush(&t), 0);
                cr_assert_eq(sg_begin(&t), 0);
            }
            issue(&t, &f, c % 3, next++);
        }
        cr_assert_eq(sg_flush(&t), 0);
    }
    assert_ran_in_order(&f, next);
    cr_assert_eq(t.segments, 18, "10 calls in segments of 4: 3 a step");
    cr_assert_eq(t.builds, 3, "%llu builds (4, 4 and 2 calls: three shapes)", (unsigned long long)t.builds);
    cr_assert_eq(sg_split(&t), 0);
    sg_free(&t);
    sg_table u = table_on(&f, 1, 0);
    cr_assert_eq(sg_begin(&u), 0);
    for (int c = 0; c < 100; c++) issue(&u, &f, 0, next++);
    cr_assert_eq(sg_split(&u), 0, "split 0 never splits");
    cr_assert_eq(sg_flush(&u), 0);
    assert_ran_in_order(&f, next);
    sg_free(&u);
    cr_assert_eq(f.live_execs + f.live_graphs, 0);
}

Test(step_graphs, an_empty_recording_runs_nothing_and_builds_nothing)
{
    fake f = { 0 };
    sg_table t = table_on(&f, 1, 0);
    cr_assert_eq(sg_begin(&t), 0);
    cr_assert_eq(sg_begin(&t), 0, "a second begin while recording is a no-op");
    cr_assert_eq(sg_flush(&t), 0);
    cr_assert_eq(sg_flush(&t), 0, "a flush with nothing recording is a no-op");
    cr_assert_eq(t.builds + t.segments, 0);
    cr_assert_eq(f.live_graphs + f.live_execs, 0);
    sg_free(&t);
}

/* Each failure of the device: -1 where work was lost, graphs off, nothing leaked; the calls after
 * it are issued as before. */
Test(step_graphs, every_device_failure_turns_graphs_off_and_leaks_nothing)
{
    for (int which = 0; which < 4; which++) {
        fake f = { 0 };
        sg_table t = table_on(&f, 1, 0);
        int next = 0;
        step(&t, &f, "0123", &next);   /* one kept graph, so a failure has something to release */
        cr_assert_eq(f.live_execs, 1);
        if (which == 0) f.fail_begin = 1;
        if (which == 1) f.fail_end = 1;
        if (which == 2) f.fail_inst = 1;
        if (which == 3) f.fail_launch = 1;
        int rc = sg_begin(&t);
        if (which == 0) {
            cr_assert_eq(rc, -1);
        } else {
            cr_assert_eq(rc, 0);
            /* a new shape for the build to fail on; the kept one otherwise (for a launch, after an update) */
            if (which == 2) issue(&t, &f, 5, 1000);
            else
                for (int s = 0; s < 4; s++) issue(&t, &f, s, 1000 + s);
            cr_assert_eq(sg_flush(&t), -1, "failure %d not reported", which);
        }
        cr_assert_not(t.on, "failure %d left graphs on", which);
        cr_assert_eq(t.failures, 1);
        cr_assert_eq(f.live_execs, 0, "failure %d kept a graph", which);
        cr_assert_eq(f.live_graphs, 0, "failure %d leaked a recorded graph", which);
        f.fail_begin = f.fail_end = f.fail_inst = f.fail_launch = 0;
        int before = f.n_ran;
        cr_assert_eq(sg_begin(&t), 0);
        issue(&t, &f, 0, 2000);
        cr_assert_eq(sg_flush(&t), 0);
        cr_assert_eq(f.n_ran, before + 1, "after failure %d a call was not issued at once", which);
        cr_assert_eq(f.ran[before], 2000);
        sg_free(&t);
    }
}

Test(step_graphs, freeing_while_recording_drops_the_recording)
{
    fake f = { 0 };
    sg_table t = table_on(&f, 1, 0);
    int next = 0;
    step(&t, &f, "01", &next);
    cr_assert_eq(sg_begin(&t), 0);
    issue(&t, &f, 0, 99);
    sg_free(&t);
    cr_assert_not(f.recording);
    cr_assert_eq(f.live_graphs + f.live_execs, 0);
    cr_assert_eq(f.n_ran, 2, "the dropped recording ran");
}
