/* test_op_profile.c - the op profiler (kernels/op_profile.c): in front of the CPU backend every op
 * gives the same bits as without it and an op the backend lacks stays absent; in front of a ledger
 * backend each call lands in its row (one token apart from several), each op's device traffic is
 * the counters' change across it, the sync mode waits once after each op and the host mode never,
 * and destroying it writes the report and destroys what it stands in front of; loading (prepare
 * and the warm-up's ops) is reported apart from the window; KVCHAT_PROFILE's values, a wrong one
 * refused by be_create with a message. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/quant.h"
#include "kernels/op_profile.h"

/* ---- a ledger backend: what was called, traffic that grows by known amounts */

typedef struct ledger {
    int finishes, destroyed, matmuls, norms;
    int slow_norms;   /* a norm takes 40 ms */
    uint64_t waits, up, down;
} ledger;

static ledger *led_of(be_backend *b) { return b->impl; }

static void l_matmul(be_backend *b, const be_mm *mms, int n_mm, const float *x, int64_t n_tok)
{
    ledger *l = led_of(b);
    l->matmuls++;
    l->up += 100 * (uint64_t)n_tok;   /* "sent its activations" */
}

static void l_rmsnorm(be_backend *b, const float *x, const float *w, float *y, int64_t rows, int64_t dim, float eps)
{
    led_of(b)->norms++;
    struct timespec ts = { 0, 40 * 1000 * 1000 };
    if (led_of(b)->slow_norms) nanosleep(&ts, NULL);
}

static void l_attention(be_backend *b, const be_attn *a)
{
    ledger *l = led_of(b);
    l->waits += 1;
    l->down += 7;
}

static void l_finish(be_backend *b) { led_of(b)->finishes++; }

/* Loading takes 60 ms. */
static int l_prepare(be_backend *b, const be_weight *const *w, int n, char *err, size_t errlen)
{
    struct timespec ts = { 0, 60 * 1000 * 1000 };
    nanosleep(&ts, NULL);
    return 0;
}

static void l_counters(be_backend *b, uint64_t *w, uint64_t *u, uint64_t *d)
{
    ledger *l = led_of(b);
    *w = l->waits, *u = l->up, *d = l->down;
}

static void l_destroy(be_backend *b) { led_of(b)->destroyed++; }

static const be_ops ledger_ops = {
    .name = "ledger",
    .matmul = l_matmul,
    .rmsnorm = l_rmsnorm,
    .attention = l_attention,
    .prepare = l_prepare,
    .destroy = l_destroy,
    .counters = l_counters,
    .finish = l_finish,
};

static be_backend ledger_backend(ledger *l)
{
    be_backend b = { &ledger_ops, 3, l };
    return b;
}

/* The report so far, as a string (the caller frees it). */
static char *report_of(be_backend *p)
{
    char *text = op_profile_text(p);
    cr_assert(text);
    return text;
}

static void run_ledger(be_backend *p)
{
    be_attn a1 = { 0 }, a9 = { 0 };
    a1.n_q = 1;
    a9.n_q = 9;
    for (int i = 0; i < 5; i++) p->ops->matmul(p, NULL, 1, NULL, 1);
    for (int i = 0; i < 2; i++) p->ops->matmul(p, NULL, 3, NULL, 64);
    p->ops->rmsnorm(p, NULL, NULL, NULL, 1, 1, 1e-6f);
    p->ops->attention(p, &a1);
    p->ops->attention(p, &a9);
    p->ops->attention(p, &a9);
}

Test(op_profile, each_call_lands_in_its_row_with_the_traffic_it_caused)
{
    ledger l = { 0 };
    be_backend in = ledger_backend(&l);
    be_backend *p = op_profile_wrap(&in, OP_PROFILE_HOST, NULL);
    cr_assert(p);
    cr_expect_eq(p->n_threads, 3);
    cr_expect_str_eq(p->ops->name, "ledger");
    /* what the ledger lacks, the profiled backend lacks */
    cr_expect_null(p->ops->pick);
    cr_expect_null(p->ops->bind);
    cr_expect_null(p->ops->get_rows);
    cr_expect_null(p->ops->failed);
    cr_expect_not_null(p->ops->finish);
    run_ledger(p);
    cr_expect_eq(l.matmuls, 7);
    cr_expect_eq(l.norms, 1);
    cr_expect_eq(l.finishes, 0, "the host mode waited for the device");
    double s = -1;
    cr_expect_eq(op_profile_calls(p, "matmul 1 token", &s), 5);
    cr_expect(s >= 0);
    cr_expect_eq(op_profile_calls(p, "matmul tokens", NULL), 2);
    cr_expect_eq(op_profile_calls(p, "rmsnorm", NULL), 1);
    cr_expect_eq(op_profile_calls(p, "attention 1 query", NULL), 1);
    cr_expect_eq(op_profile_calls(p, "attention queries", NULL), 2);
    cr_expect_eq(op_profile_calls(p, "pick", NULL), 0);
    cr_expect_eq(op_profile_calls(p, "no such row", &s), 0);
    cr_expect_eq(s, 0);

    char *text = report_of(p);
    /* rows: name, calls, ms, us/call, max us, share, waits, MiB up, MiB down */
    char *line = strstr(text, "\nmatmul tokens ");
    cr_assert(line, "%s", text);
    long calls;
    double ms, per, mx, share, mib_up, mib_down;
    unsigned long long waits;
    cr_assert_eq(sscanf(line + 1, "matmul tokens %ld %lf %lf %lf %lf%% %llu %lf %lf", &calls, &ms, &per, &mx, &share,
                        &waits, &mib_up, &mib_down),
                 8, "%s", line);
    cr_expect_eq(calls, 2);
    cr_expect_eq(waits, 0);
    cr_expect(fabs(mib_up - 2 * 6400.0 / (1 << 20)) < 0.006, "%g", mib_up);
    line = strstr(text, "\nattention queries ");
    cr_assert(line, "%s", text);
    cr_assert_eq(sscanf(line + 1, "attention queries %ld %lf %lf %lf %lf%% %llu %lf %lf", &calls, &ms, &per, &mx, &share,
                        &waits, &mib_up, &mib_down),
                 8, "%s", line);
    cr_expect_eq(calls, 2);
    cr_expect_eq(waits, 2, "the attention calls' waits were not theirs");
    cr_expect(strstr(text, "\nbetween ops "), "%s", text);
    cr_expect_null(strstr(text, "\npick "), "a row with no calls was written");
    cr_expect(strstr(text, "ledger backend, host time in each op"), "%s", text);
    free(text);

    p->ops->destroy(p);
    cr_expect_eq(l.destroyed, 1);
}

Test(op_profile, the_sync_mode_waits_once_after_each_op)
{
    ledger l = { 0 };
    be_backend in = ledger_backend(&l);
    be_backend *p = op_profile_wrap(&in, OP_PROFILE_SYNC, NULL);
    cr_assert(p);
    run_ledger(p);
    cr_expect_eq(l.finishes, 11);   /* 7 products, a norm, 3 attention calls */
    uint64_t w = 0, u = 0, d = 0;
    p->ops->counters(p, &w, &u, &d);   /* passed through, nothing added */
    cr_expect(w == 3 && u == 5 * 100 + 2 * 6400 && d == 21, "counters %llu %llu %llu", (unsigned long long)w,
              (unsigned long long)u, (unsigned long long)d);
    p->ops->finish(p);   /* the caller's own finish reaches the backend */
    cr_expect_eq(l.finishes, 12);
    p->ops->destroy(p);
    cr_expect_eq(l.destroyed, 1);
}

/* What destroying a profiled ledger backend after a few ops writes to its report (discarded first
 * or not; the caller frees it), with what it stood in front of destroyed once. */
static char *report_at_destroy(int discard, size_t *len)
{
    ledger l = { 0 };
    be_backend in = ledger_backend(&l);
    char *text = NULL;
    FILE *f = open_memstream(&text, len);
    cr_assert(f);
    be_backend *p = op_profile_wrap(&in, OP_PROFILE_SYNC, f);
    run_ledger(p);
    if (discard) op_profile_discard(p);
    p->ops->destroy(p);
    fclose(f);
    cr_expect_eq(l.destroyed, 1);
    op_profile_discard(&in);   /* not a profile: nothing */
    return text;
}

Test(op_profile, destroying_writes_the_report)
{
    size_t len = 0;
    char *text = report_at_destroy(0, &len);
    cr_expect(strstr(text, "kvchat profile (ledger backend, each op waited for"), "%s", text);
    cr_expect(strstr(text, "\nmatmul 1 token "), "%s", text);
    free(text);
}

/* A backend given up before the run (be_discard: the GPU --device auto leaves) writes no report;
 * what it stands in front of is destroyed all the same. */
Test(op_profile, a_discarded_backend_writes_no_report)
{
    size_t len = 0;
    char *text = report_at_destroy(1, &len);
    cr_expect_eq(len, 0, "a discarded backend's report: %s", text);
    free(text);
}

/* In front of the CPU backend: the same bits as the CPU backend alone. */
Test(op_profile, the_cpu_backend_behind_it_gives_the_same_bits)
{
    char err[256];
    be_backend *cpu = be_cpu_create(2, err, sizeof err);
    be_backend *raw = be_cpu_create(2, err, sizeof err);
    cr_assert(cpu && raw, "%s", err);
    be_backend *p = op_profile_wrap(cpu, OP_PROFILE_SYNC, NULL);
    cr_assert(p);
    cr_expect_null(p->ops->finish, "the CPU backend has no finish: neither has its profile");
    enum { N_IN = 96, N_OUT = 40, T = 3 };
    static float w[N_OUT * N_IN], x[T * N_IN], y0[T * N_OUT], y1[T * N_OUT], g[N_IN], n0[T * N_IN], n1[T * N_IN];
    srand(7);
    for (int i = 0; i < N_OUT * N_IN; i++) w[i] = (float)(rand() % 1000) / 1000.0f - 0.5f;
    for (int i = 0; i < T * N_IN; i++) x[i] = (float)(rand() % 1000) / 1000.0f - 0.5f;
    for (int i = 0; i < N_IN; i++) g[i] = 1.0f + (float)i / N_IN;
    be_weight wt = { w, GGML_TYPE_F32, N_IN, N_OUT, sizeof(float) * N_IN };
    be_mm m0 = { &wt, y0 }, m1 = { &wt, y1 };
    raw->ops->matmul(raw, &m0, 1, x, T);
    p->ops->matmul(p, &m1, 1, x, T);
    cr_expect_eq(memcmp(y0, y1, sizeof y0), 0);
    raw->ops->rmsnorm(raw, x, g, n0, T, N_IN, 1e-6f);
    p->ops->rmsnorm(p, x, g, n1, T, N_IN, 1e-6f);
    cr_expect_eq(memcmp(n0, n1, sizeof n0), 0);
    cr_expect_eq(op_profile_calls(p, "matmul tokens", NULL), 1);
    cr_expect_eq(op_profile_calls(p, "rmsnorm", NULL), 1);
    be_free(p);
    be_free(raw);
}

Test(op_profile, kvchat_profile_takes_1_or_sync)
{
    unsetenv("KVCHAT_PROFILE");
    cr_expect_eq(op_profile_mode_from_env(), 0);
    setenv("KVCHAT_PROFILE", "", 1);
    cr_expect_eq(op_profile_mode_from_env(), 0);
    setenv("KVCHAT_PROFILE", "0", 1);
    cr_expect_eq(op_profile_mode_from_env(), 0);
    setenv("KVCHAT_PROFILE", "1", 1);
    cr_expect_eq(op_profile_mode_from_env(), OP_PROFILE_HOST);
    setenv("KVCHAT_PROFILE", "sync", 1);
    cr_expect_eq(op_profile_mode_from_env(), OP_PROFILE_SYNC);
    setenv("KVCHAT_PROFILE", "yes", 1);
    cr_expect_eq(op_profile_mode_from_env(), -1);
    char err[256] = "";
    cr_expect_null(be_create(BE_DEVICE_CPU, 1, err, sizeof err));
    cr_expect(strstr(err, "KVCHAT_PROFILE must be 1"), "%s", err);
    setenv("KVCHAT_PROFILE", "1", 1);
    be_backend *b = be_create(BE_DEVICE_CPU, 1, err, sizeof err);
    cr_assert(b, "%s", err);
    float x[4] = { 1, 2, 3, 4 }, g[4] = { 1, 1, 1, 1 }, y[4];
    b->ops->rmsnorm(b, x, g, y, 1, 4, 1e-6f);
    cr_expect_eq(op_profile_calls(b, "rmsnorm", NULL), 1, "be_create did not put the profiler in front");
    unsetenv("KVCHAT_PROFILE");
    b->ops->destroy(b);   /* its (empty) report goes to standard error */
}

/* The report's window is under max_window seconds (the load's slow ops are outside it), and the
 * row of loading named `name` is there with no share of it. */
static void expect_load_row(be_backend *p, const char *name, double max_window)
{
    char *text = report_of(p);
    const char *at = strstr(text, "): ");
    double window = -1;
    cr_assert(at && sscanf(at, "): %lf s from the first op after loading", &window) == 1, "%s", text);
    cr_expect_lt(window, max_window, "the window (%g s) holds the %s", window, name);
    char key[64], fmt[96];
    snprintf(key, sizeof key, "\n%s ", name);
    snprintf(fmt, sizeof fmt, "%s %%ld %%lf %%lf %%lf %%lf%%%%", name);
    const char *row = strstr(text, key);
    cr_assert(row, "%s", text);
    long calls;
    double ms, per, mx, share;
    cr_assert_eq(sscanf(row + 1, fmt, &calls, &ms, &per, &mx, &share), 5, "%s", row);
    cr_expect_eq(share, 0, "%s given a share of the window", name);
    free(text);
}

/* Loading (prepare) is reported but outside the window: a 60 ms load before a few quick ops leaves
 * a window of those ops alone. */
Test(op_profile, loading_is_outside_the_window)
{
    ledger l = { 0 };
    be_backend in = ledger_backend(&l);
    be_backend *p = op_profile_wrap(&in, OP_PROFILE_HOST, NULL);
    char err[64];
    cr_assert_eq(p->ops->prepare(p, NULL, 0, err, sizeof err), 0);
    run_ledger(p);
    double s = 0;
    cr_expect_eq(op_profile_calls(p, "prepare", &s), 1);
    cr_expect_geq(s, 0.055);
    expect_load_row(p, "prepare", 0.05);
    p->ops->destroy(p);
}

/* The warm-up's ops (be_warming_up) are loading's: their own row, outside the window, and in no op's
 * row; the ops after it are counted as ever. On a backend the profiler did not make it does nothing. */
Test(op_profile, the_warm_up_is_loading_in_a_row_of_its_own)
{
    ledger l = { 0 };
    be_backend in = ledger_backend(&l);
    be_warming_up(&in, 1);   /* not a profiler: nothing to mark */
    be_warming_up(&in, 0);
    be_backend *p = op_profile_wrap(&in, OP_PROFILE_HOST, NULL);
    cr_assert(p);
    l.slow_norms = 1;
    be_warming_up(p, 1);
    run_ledger(p);
    be_warming_up(p, 0);
    l.slow_norms = 0;
    run_ledger(p);
    cr_expect_eq(l.matmuls, 14, "the warm-up's ops did not reach the backend");
    double s = 0;
    cr_expect_eq(op_profile_calls(p, "warm-up", &s), 11);   /* 7 products, a norm, 3 attention calls */
    cr_expect_geq(s, 0.035);
    cr_expect_eq(op_profile_calls(p, "matmul 1 token", NULL), 5);
    cr_expect_eq(op_profile_calls(p, "matmul tokens", NULL), 2);
    cr_expect_eq(op_profile_calls(p, "rmsnorm", &s), 1);
    cr_expect_lt(s, 0.03, "the warm-up's slow norm was counted as the run's");
    cr_expect_eq(op_profile_calls(p, "attention queries", NULL), 2);
    expect_load_row(p, "warm-up", 0.03);
    p->ops->destroy(p);
}
