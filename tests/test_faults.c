/* test_faults.c - fault injection as sqlite tests itself: the Nth allocation (kvchat's own, through the
 * linker's --wrap of malloc/calloc/realloc, and sqlite's, through SQLITE_CONFIG_MALLOC) or the Nth
 * file write (a VFS that wraps the default one) fails, for N = 1, 2, ... until the operation no
 * longer reaches a fault. Every failure must come back as an error with a message (never a crash),
 * the database must pass its integrity check, and the snapshot saved before must still load and
 * verify. `make asan` runs the same loops under AddressSanitizer, whose leak check at exit covers
 * what every failure path freed. */
#include <criterion/criterion.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/bytes.h"
#include "engine/kvcache.h"
#include "engine/model.h"
#include "engine/policy/policy.h"
#include "engine/snapshot.h"
#include "kernels/backend.h"
#include "store/store.h"
#include "tests/fwd_fixture.h"

#define TD "../shared/testdata/"

/* ---- the faults */

static long fault_at;       /* 0: off; else the allocation (or write) that fails */
static long n_calls;
static int fail_writes;     /* which the counter counts: 0 allocations, 1 file writes, 2 file reads */

static int should_fail(void)
{
    if (!fault_at) return 0;
    return ++n_calls == fault_at;
}

void *__real_malloc(size_t n);
void *__real_calloc(size_t a, size_t b);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t a, size_t b);
void *__wrap_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n) { return !fail_writes && should_fail() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t a, size_t b) { return !fail_writes && should_fail() ? NULL : __real_calloc(a, b); }
void *__wrap_realloc(void *p, size_t n) { return !fail_writes && should_fail() ? NULL : __real_realloc(p, n); }

static sqlite3_mem_methods real_mem;
static void *sq_malloc(int n) { return !fail_writes && should_fail() ? NULL : real_mem.xMalloc(n); }
static void *sq_realloc(void *p, int n) { return !fail_writes && should_fail() ? NULL : real_mem.xRealloc(p, n); }

/* The default VFS with xWrite failing on the Nth write. */
static sqlite3_vfs *real_vfs;
static sqlite3_vfs shim_vfs;
static int (*real_open)(sqlite3_vfs *, const char *, sqlite3_file *, int, int *);
typedef struct shim_file {
    sqlite3_file base;       /* methods: shim_io */
    sqlite3_file *real;      /* the default VFS's file, after this struct */
} shim_file;
static sqlite3_io_methods shim_io;
static const sqlite3_io_methods *real_io;

#define REAL(f) (((shim_file *)(f))->real)
static int s_close(sqlite3_file *f) { return REAL(f)->pMethods ? REAL(f)->pMethods->xClose(REAL(f)) : SQLITE_OK; }
static int s_read(sqlite3_file *f, void *b, int n, sqlite3_int64 o)
{
    if (fail_writes == 2 && should_fail()) return SQLITE_IOERR_READ;
    return REAL(f)->pMethods->xRead(REAL(f), b, n, o);
}
static int s_write(sqlite3_file *f, const void *b, int n, sqlite3_int64 o)
{
    if (fail_writes == 1 && should_fail()) return SQLITE_IOERR_WRITE;
    return REAL(f)->pMethods->xWrite(REAL(f), b, n, o);
}
static int s_truncate(sqlite3_file *f, sqlite3_int64 n) { return REAL(f)->pMethods->xTruncate(REAL(f), n); }
static int s_sync(sqlite3_file *f, int fl) { return REAL(f)->pMethods->xSync(REAL(f), fl); }
static int s_size(sqlite3_file *f, sqlite3_int64 *n) { return REAL(f)->pMethods->xFileSize(REAL(f), n); }
static int s_lock(sqlite3_file *f, int l) { return REAL(f)->pMethods->xLock(REAL(f), l); }
static int s_unlock(sqlite3_file *f, int l) { return REAL(f)->pMethods->xUnlock(REAL(f), l); }
static int s_check(sqlite3_file *f, int *o) { return REAL(f)->pMethods->xCheckReservedLock(REAL(f), o); }
static int s_fctl(sqlite3_file *f, int op, void *a) { return REAL(f)->pMethods->xFileControl(REAL(f), op, a); }
static int s_sector(sqlite3_file *f) { return REAL(f)->pMethods->xSectorSize(REAL(f)); }
static int s_dev(sqlite3_file *f) { return REAL(f)->pMethods->xDeviceCharacteristics(REAL(f)); }
static int s_shmmap(sqlite3_file *f, int i, int sz, int e, void volatile **pp)
{
    return REAL(f)->pMethods->xShmMap(REAL(f), i, sz, e, pp);
}
static int s_shmlock(sqlite3_file *f, int o, int n, int fl) { return REAL(f)->pMethods->xShmLock(REAL(f), o, n, fl); }
static void s_shmbarrier(sqlite3_file *f) { REAL(f)->pMethods->xShmBarrier(REAL(f)); }
static int s_shmunmap(sqlite3_file *f, int d) { return REAL(f)->pMethods->xShmUnmap(REAL(f), d); }
static int s_fetch(sqlite3_file *f, sqlite3_int64 o, int n, void **pp) { return REAL(f)->pMethods->xFetch(REAL(f), o, n, pp); }
static int s_unfetch(sqlite3_file *f, sqlite3_int64 o, void *p) { return REAL(f)->pMethods->xUnfetch(REAL(f), o, p); }

static int s_open(sqlite3_vfs *v, const char *name, sqlite3_file *f, int flags, int *out)
{
    (void)v;
    shim_file *sf = (shim_file *)f;
    sf->real = (sqlite3_file *)(sf + 1);
    int rc = real_open(real_vfs, name, sf->real, flags, out);
    real_io = sf->real->pMethods;
    sf->base.pMethods = rc == SQLITE_OK && sf->real->pMethods ? &shim_io : NULL;
    return rc;
}

static void faults_setup(void)
{
    sqlite3_config(SQLITE_CONFIG_GETMALLOC, &real_mem);
    sqlite3_mem_methods m = real_mem;
    m.xMalloc = sq_malloc;
    m.xRealloc = sq_realloc;
    cr_assert(sqlite3_config(SQLITE_CONFIG_MALLOC, &m) == SQLITE_OK);
    cr_assert(sqlite3_initialize() == SQLITE_OK);
    real_vfs = sqlite3_vfs_find(NULL);
    shim_vfs = *real_vfs;
    shim_vfs.zName = "kvchat-faults";
    shim_vfs.szOsFile = (int)sizeof(shim_file) + real_vfs->szOsFile;
    real_open = real_vfs->xOpen;
    shim_vfs.xOpen = s_open;
    shim_io = (sqlite3_io_methods){ 3, s_close, s_read, s_write, s_truncate, s_sync, s_size, s_lock, s_unlock, s_check,
                                    s_fctl, s_sector, s_dev, s_shmmap, s_shmlock, s_shmbarrier, s_shmunmap, s_fetch,
                                    s_unfetch };
    cr_assert(sqlite3_vfs_register(&shim_vfs, 1) == SQLITE_OK);
}

/* ---- what is saved: two real snapshots of one sequence on a tiny model */

typedef struct fx {
    char dir[64], db[128];
    void *snap[2];
    size_t len[2];
    int64_t sid, msg[2];
} fx;

static void make_snapshots(fx *x)
{
    char err[512];
    model *m;
    cr_assert(model_load(&m, TD "tiny/tiny-gemma3-q4_k_m.gguf", NULL, err, sizeof err) == 0, "%s", err);
    be_backend *b = be_cpu_create(1, err, sizeof err);
    fwd_opts fo = { 1024, 64, 8 };
    fwd_ctx *f = fwd_create(m, b, &fo, err, sizeof err);
    samp_params sp = samp_params_default();
    samp *s = samp_create(&sp, m->hp.n_vocab);
    cr_assert(f && s);
    int32_t toks[300];
    for (int i = 0; i < 300; i++) toks[i] = 100 + (i * 37) % 3000;
    float *l = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
    snap_identity id;
    snap_identity_of(f, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", &id);
    for (int k = 0; k < 2; k++) {
        int64_t from = k ? 200 : 0, to = k ? 240 : 200;
        cr_assert(fwd_eval(f, toks + from, to - from, l, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
        cr_assert(snap_save(f, s, &id, toks, to, &x->snap[k], &x->len[k], err, sizeof err) == 0, "%s", err);
    }
    free(l);
    samp_free(s);
    fwd_free(f);
    be_free(b);
    model_free(m);
}

static store *open_db(fx *x)
{
    char err[600];
    store *d = store_open(x->db, err, sizeof err);
    cr_assert(d, "%s", err);
    return d;
}

static void fx_open(fx *x)
{
    snprintf(x->dir, sizeof x->dir, "/tmp/kvchat-faults-XXXXXX");
    cr_assert(mkdtemp(x->dir));
    snprintf(x->db, sizeof x->db, "%s/f.db", x->dir);
    make_snapshots(x);
    store *d = open_db(x);
    int64_t mid, did, um;
    cr_assert(store_model_put(d, "m.gguf", 1, 1, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "gemma3",
                              "t", "m", &mid) == 0);
    cr_assert(store_document_put(d, mid, "/d.txt", "dsha", "d.txt", 200, &did) == 0);
    cr_assert(store_session_create(d, "f", "faults", mid, did, "full", "", "plain", &x->sid) == 0);
    for (int k = 0; k < 2; k++) {
        cr_assert(store_message_add(d, x->sid, k ? x->msg[0] : 0, "user", "q", "full", NULL, &um) == 0);
        cr_assert(store_message_add(d, x->sid, um, "assistant", "a", "full", NULL, &x->msg[k]) == 0);
    }
    int64_t snap_id;
    cr_assert(store_snapshot_put(d, x->sid, x->msg[0], "full", 200, x->snap[0], x->len[0], &snap_id) == 0);
    store_close(d);
}

static void fx_close(fx *x)
{
    free(x->snap[0]);
    free(x->snap[1]);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", x->dir);
    cr_expect(system(cmd) == 0);
}

/* After a failure: the file is consistent and the first snapshot reads back byte for byte. */
static void expect_intact(fx *x, long n, const char *what)
{
    store *d = open_db(x);
    cr_expect(store_check(d) == 0, "%s %ld: %s", what, n, store_error(d));
    void *data = NULL;
    size_t len = 0;
    cr_expect(store_snapshot_get(d, x->msg[0], "full", &data, &len) == 0, "%s %ld: %s", what, n, store_error(d));
    cr_expect(len == x->len[0] && data && !memcmp(data, x->snap[0], len), "%s %ld: the earlier snapshot changed", what, n);
    free(data);
    store_close(d);
}

/* Save the second snapshot with fault N; 1 when the fault was reached (and the save failed cleanly). */
static int save_with_fault(fx *x, long n, int writes)
{
    store *d = open_db(x);
    int64_t snap_id;
    fail_writes = writes;
    n_calls = 0;
    fault_at = n;
    int rc = store_snapshot_put(d, x->sid, x->msg[1], "full", 240, x->snap[1], x->len[1], &snap_id);
    int reached = n_calls >= n;
    fault_at = 0;
    if (rc) {
        cr_expect(store_error(d)[0] != 0, "%s %ld: a failure without a message", writes ? "write" : "allocation", n);
    } else {
        /* a fault some part absorbs (sqlite's benign allocation failures, pages stored whole when their
         * list could not be made) must still leave the snapshot whole */
        void *data = NULL;
        size_t len = 0;
        cr_expect(store_snapshot_get(d, x->msg[1], "full", &data, &len) == 0 && len == x->len[1] &&
                      !memcmp(data, x->snap[1], len),
                  "%s %ld: saved without an error, but it does not read back", writes ? "write" : "allocation", n);
        free(data);
    }
    store_close(d);
    return reached;
}

Test(faults, every_allocation_and_write_failure_in_saving_a_snapshot_is_an_error_and_loses_nothing,
     .init = faults_setup, .timeout = 600)
{
    fx x;
    fx_open(&x);
    long n;
    for (n = 1; n < 100000 && save_with_fault(&x, n, 0); n++) expect_intact(&x, n, "allocation");
    cr_log_info("saving a snapshot: %ld allocations, each failed once", n - 1);
    cr_expect_gt(n, 10, "the loop reached the allocations");
    for (n = 1; n < 100000 && save_with_fault(&x, n, 1); n++) expect_intact(&x, n, "write");
    cr_log_info("saving a snapshot: %ld file writes, each failed once", n - 1);
    cr_expect_gt(n, 2, "the loop reached the writes");
    /* without faults the second snapshot saves and both read back */
    store *d = open_db(&x);
    int64_t snap_id;
    cr_assert(store_snapshot_put(d, x.sid, x.msg[1], "full", 240, x.snap[1], x.len[1], &snap_id) == 0, "%s",
              store_error(d));
    void *data;
    size_t len;
    cr_assert(store_snapshot_get(d, x.msg[1], "full", &data, &len) == 0);
    cr_expect(len == x.len[1] && !memcmp(data, x.snap[1], len));
    free(data);
    store_close(d);
    expect_intact(&x, 0, "after");
    fx_close(&x);
}

Test(faults, every_allocation_failure_in_reading_a_snapshot_is_an_error, .init = faults_setup, .timeout = 600)
{
    fx x;
    fx_open(&x);
    long n;
    for (n = 1; n < 100000; n++) {
        store *d = open_db(&x);
        void *data = NULL;
        size_t len;
        fail_writes = 0;
        n_calls = 0;
        fault_at = n;
        int rc = store_snapshot_get(d, x.msg[0], "full", &data, &len);
        int reached = n_calls >= n;
        fault_at = 0;
        if (reached) {
            cr_expect(rc != 0 && store_error(d)[0], "allocation %ld: a read that failed said nothing", n);
        } else {
            cr_expect(rc == 0 && len == x.len[0] && !memcmp(data, x.snap[0], len));
        }
        free(data);
        store_close(d);
        if (!reached) break;
    }
    cr_log_info("reading a snapshot: %ld allocations, each failed once", n - 1);
    cr_expect_gt(n, 3);
    fx_close(&x);
}

/* A file read that fails while a snapshot is read (its row, its pages) is an error with a message,
 * never a crash or a snapshot put together wrong; without the fault it reads back whole. */
Test(faults, every_read_failure_in_reading_a_snapshot_is_an_error, .init = faults_setup, .timeout = 600)
{
    fx x;
    fx_open(&x);
    long n;
    for (n = 1; n < 100000; n++) {
        fail_writes = 0;
        store *d = open_db(&x);   /* opened without faults: the failures fall in the read itself */
        void *data = NULL;
        size_t len = 0;
        fail_writes = 2;
        n_calls = 0;
        fault_at = n;
        int rc = store_snapshot_get(d, x.msg[0], "full", &data, &len);
        int reached = n_calls >= n;
        fault_at = 0;
        if (rc) cr_expect(store_error(d)[0], "read %ld: a read that failed said nothing", n);
        else cr_expect(len == x.len[0] && !memcmp(data, x.snap[0], len), "read %ld: read back different bytes", n);
        free(data);
        store_close(d);
        if (!reached) break;
    }
    fail_writes = 0;
    cr_log_info("reading a snapshot: %ld file reads, each failed once", n - 1);
    cr_expect_gt(n, 2, "the loop reached the reads");
    fx_close(&x);
}

/* The store damaged under a snapshot (a page deleted or written over, its row's size or data
 * changed, a page's place lost): reading it is an error or bytes that differ (which the snapshot's
 * checksum refuses), never a crash; saving the same snapshot again makes it whole, the damaged page
 * replaced rather than kept under its hash. */
Test(faults, a_damaged_snapshot_reads_as_an_error_and_saving_it_again_repairs_it, .init = faults_setup,
     .timeout = 600)
{
#define PAGE "(SELECT hash FROM snapshot_chunks ORDER BY snapshot_id, off LIMIT 1 OFFSET 1)"
    static const char *const damage[] = {
        "DELETE FROM chunks WHERE hash = " PAGE,
        "UPDATE chunks SET data = zeroblob(length(data)) WHERE hash = " PAGE,
        "UPDATE chunks SET data = substr(data, 1, length(data) - 1) WHERE hash = " PAGE,
        "UPDATE snapshots SET bytes = bytes + 4356",
        "UPDATE snapshots SET bytes = bytes - 100",
        "UPDATE snapshots SET data = zeroblob(length(data))",
        "DELETE FROM snapshot_chunks WHERE off = (SELECT MIN(off) FROM snapshot_chunks)",
        "UPDATE snapshot_chunks SET off = off + 1 WHERE off = (SELECT MAX(off) FROM snapshot_chunks)",
    };
#undef PAGE
    for (int k = 0; k < (int)(sizeof damage / sizeof damage[0]); k++) {
        fx x;
        fx_open(&x);
        sqlite3 *db;
        cr_assert(sqlite3_open(x.db, &db) == SQLITE_OK);
        char *e = NULL;
        cr_assert(sqlite3_exec(db, damage[k], NULL, NULL, &e) == SQLITE_OK, "%s: %s", damage[k], e);
        cr_assert(sqlite3_changes(db) > 0, "%s changed nothing", damage[k]);
        sqlite3_close(db);
        store *d = open_db(&x);
        void *data = NULL;
        size_t len = 0;
        int rc = store_snapshot_get(d, x.msg[0], "full", &data, &len);
        if (rc) cr_expect(rc < 0 && store_error(d)[0], "damage %d: an error without a message", k);
        else cr_expect(len != x.len[0] || memcmp(data, x.snap[0], len), "damage %d: read back as if whole", k);
        free(data);
        int64_t snap_id;
        cr_assert(store_snapshot_put(d, x.sid, x.msg[0], "full", 200, x.snap[0], x.len[0], &snap_id) == 0,
                  "damage %d: %s", k, store_error(d));
        data = NULL;
        cr_expect(store_snapshot_get(d, x.msg[0], "full", &data, &len) == 0 && len == x.len[0] &&
                      !memcmp(data, x.snap[0], len),
                  "damage %d: saving the snapshot again did not make it whole (%s)", k, store_error(d));
        free(data);
        cr_expect(store_check(d) == 0, "damage %d: %s", k, store_error(d));
        store_close(d);
        fx_close(&x);
    }
}

Test(faults, every_allocation_failure_in_serializing_a_sequence_is_an_error, .init = faults_setup, .timeout = 600)
{
    char err[512];
    model *m;
    cr_assert(model_load(&m, TD "tiny/tiny-gemma3-q4_k_m.gguf", NULL, err, sizeof err) == 0, "%s", err);
    be_backend *b = be_cpu_create(1, err, sizeof err);
    fwd_opts fo = { 1024, 64, 8 };
    fwd_ctx *f = fwd_create(m, b, &fo, err, sizeof err);
    samp_params sp = samp_params_default();
    samp *s = samp_create(&sp, m->hp.n_vocab);
    int32_t toks[240];
    for (int i = 0; i < 240; i++) toks[i] = 100 + (i * 37) % 3000;
    float *l = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
    cr_assert(fwd_eval(f, toks, 240, l, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    snap_identity id;
    snap_identity_of(f, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", &id);
    void *want;
    size_t want_len;
    cr_assert(snap_save(f, s, &id, toks, 240, &want, &want_len, err, sizeof err) == 0, "%s", err);
    long n;
    for (n = 1; n < 100000; n++) {
        void *got = NULL;
        size_t len = 0;
        err[0] = 0;
        fail_writes = 0;
        n_calls = 0;
        fault_at = n;
        int rc = snap_save(f, s, &id, toks, 240, &got, &len, err, sizeof err);
        int reached = n_calls >= n;
        fault_at = 0;
        if (rc) cr_expect(err[0], "allocation %ld: a failure without a message", n);
        else cr_expect(len == want_len && !memcmp(got, want, len), "allocation %ld: saved different bytes", n);
        free(got);
        if (!reached) break;
    }
    cr_log_info("serializing a sequence: %ld allocations, each failed once", n - 1);
    cr_expect_gt(n, 1);
    free(want);
    free(l);
    samp_free(s);
    fwd_free(f);
    be_free(b);
    model_free(m);
}

/* ---- CHESS's kept summaries */

Test(faults, every_allocation_failure_in_chess_s_reconstruction_leaves_the_next_step_right, .timeout = 600)
{
    /* CHESS keeps its summaries between steps and grows them with the context. With the Nth
     * allocation of a reconstruction failing, at the first one (every buffer made) and at one that
     * grows them (the context doubled), the step attends to everything or to pages that exist, and
     * the next step, without a fault, chooses what a set made then chooses. */
    char err[512];
    be_backend *b = be_cpu_create(1, err, sizeof err);
    cr_assert(b, "%s", err);
    int global[2] = { 0, 1 };
    pol_spec spec;
    cr_assert(pol_parse(&spec, "chess:sink=1,window=1,chunk=2,grid=2,rho_g=0.5,rho_c=0.5,rho_p=0.5", NULL, err,
                        sizeof err) == 0, "%s", err);
    long n, reached_any = 1;
    for (n = 1; n < 1000 && reached_any; n++) {
        reached_any = 0;
        kv_cache *kv = kv_create(2, 4096, 2, 8, 4, NULL, err, sizeof err);
        cr_assert(kv, "%s", err);
        pol_env env = { kv, b, 2, 2, 8, global, 2, NULL, 0, NULL, NULL, NULL, NULL, 0, NULL, NULL };
        uint64_t r = 0x5EED + (uint64_t)n;
        fwd_fixture_random_keys(kv, 2, 60, &r);
        pol_set *ps = pol_set_create(&spec, &env, err, sizeof err);
        cr_assert(ps, "%s", err);
        for (int phase = 0; phase < 2; phase++) {
            if (phase == 1) fwd_fixture_random_keys(kv, 2, 200, &r);   /* the pages grow past twice the first build */
            char got[2048], want[2048];
            n_calls = 0;
            fault_at = n;
            fwd_fixture_choice(ps, kv_len(kv) - 1, got, sizeof got);
            reached_any |= n_calls >= n;
            fault_at = 0;
            if (strcmp(got, "all") != 0) {   /* pages that exist, ascending */
                int last = -1, np = kv_n_pages(kv, 0, 0), ok = 1;
                for (const char *c = got; *c;) {
                    char *e;
                    long p = strtol(c, &e, 10);
                    ok &= p > last && p < np;
                    last = (int)p;
                    c = *e ? e + 1 : e;
                }
                cr_expect(ok, "allocation %ld, phase %d: %s", n, phase, got);
            }
            fwd_fixture_random_keys(kv, 2, 1, &r);
            fwd_fixture_choice(ps, kv_len(kv) - 1, got, sizeof got);
            pol_set *fresh = pol_set_create(&spec, &env, err, sizeof err);
            cr_assert(fresh, "%s", err);
            fwd_fixture_choice(fresh, kv_len(kv) - 1, want, sizeof want);
            pol_set_free(fresh);
            cr_expect_str_eq(got, want, "allocation %ld, phase %d: the step after the failure chose otherwise", n,
                             phase);
        }
        pol_set_free(ps);
        kv_free(kv);
    }
    cr_log_info("chess: %ld allocations a run, each failed once", n - 2);
    cr_expect_gt(n, 5);
    be_free(b);
}

/* Everything a cache holds as bytes (kv_save: its shape, positions and rows), and its figures. */
static int cache_is(const kv_cache *kv, const bytes_w *img, const kv_stats *st)
{
    bytes_w w = { 0 };
    kv_save(kv, &w);
    kv_stats now;
    kv_get_stats(kv, &now);
    int same = !w.err && w.n == img->n && !memcmp(w.p, img->p, w.n) && now.bytes_resident == st->bytes_resident &&
               now.tokens_kept == st->tokens_kept && now.pages == st->pages;
    bw_free(&w);
    return same;
}

/* An append spread over the host's threads (kv_append_on) and an eviction's (kv_keep_tokens_on),
 * with the Nth allocation failing, into a cache whose last pages a fork shares: each either
 * succeeds or fails with the cache exactly as it was (rows, positions, figures). */
Test(faults, every_allocation_failure_in_a_spread_append_or_eviction_leaves_the_cache_as_it_was, .timeout = 600)
{
    enum { H = 3, R = 64, P = 16, N = 300 };
    char err[256];
    be_backend *b = be_cpu_create(2, err, sizeof err);
    cr_assert(b, "%s", err);
    float *k = malloc(sizeof(float) * N * H * R), *v = malloc(sizeof(float) * N * H * R);
    int64_t *keep = malloc(sizeof(int64_t) * 2 * N);
    cr_assert(k && v && keep);
    for (int i = 0; i < N * H * R; i++) k[i] = v[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    for (int what = 0; what < 2; what++) {
        long n, reached = 1, failed = 0;
        for (n = 1; n < 400 && reached; n++) {
            kv_cache *kv = kv_create(2, 4096, H, R, P, NULL, err, sizeof err);
            cr_assert(kv, "%s", err);
            for (int il = 0; il < 2; il++) cr_assert(kv_append(kv, il, k, v, 70, 0) == 0);
            kv_commit(kv, 70);
            kv_cache *fork = kv_fork(kv, err, sizeof err);   /* the last pages shared: copied first */
            cr_assert(fork, "%s", err);
            bytes_w img = { 0 };
            kv_save(kv, &img);
            cr_assert(!img.err);
            kv_stats st;
            kv_get_stats(kv, &st);
            int64_t nk = 0;
            for (int64_t j = 0; j < 70; j++)
                if (j % 3 != 1) keep[nk++] = j;
            n_calls = 0;
            fault_at = n;
            int rc = what == 0 ? kv_append_on(kv, b, 1, k, v, N, 70) : kv_keep_tokens_on(kv, b, 1, 2, keep, nk);
            reached = n_calls >= n;
            fault_at = 0;
            if (rc) {
                failed++;
                cr_expect(cache_is(kv, &img, &st), "%s, allocation %ld failed: the cache changed",
                          what ? "eviction" : "append", n);
            }
            bw_free(&img);
            kv_free(fork);
            kv_free(kv);
        }
        cr_expect_gt(failed, 0, "%s: no allocation failure was reached", what ? "eviction" : "append");
    }
    free(k);
    free(v);
    free(keep);
    be_free(b);
}

/* A prompt's last chunk done on layer 0 (the one global layer) under a policy, with the Nth
 * allocation failing for N = 1, 2, ... until none is reached: each run either fails with a message
 * or leaves the cache as the run without a failure does, which must have dropped or merged tokens.
 * The runs that failed and those that kept the same are counted. `make asan` checks that every
 * failure path frees what it made. */
typedef struct layer_faults {
    const char *spec, *what;
    int n_layer, page;
    int64_t T, n_probe;     /* the prompt's tokens and the probe rows after them */
    uint64_t seed;
    long failed, same, allocs;
} layer_faults;

static void layer_done_under_faults(layer_faults *lf)
{
    enum { H = 2, NH = 4, D = 8 };
    char err[512];
    be_backend *b = be_cpu_create(2, err, sizeof err);
    cr_assert(b, "%s", err);
    int global[1] = { 0 };   /* one global layer: its choice alone decides (a wrong one shows) */
    pol_spec spec;
    cr_assert(pol_parse(&spec, lf->spec, NULL, err, sizeof err) == 0, "%s", err);
    const int64_t rows = lf->T + lf->n_probe;
    float *q = malloc(sizeof(float) * (size_t)(rows * NH * D));
    cr_assert(q);
    for (int64_t i = 0; i < rows * NH * D; i++) q[i] = (float)((i * 29) % 97) / 48.0f - 1.0f;
    bytes_w want = { 0 };
    long n, reached = 1;
    for (n = 0; n < 600 && reached; n++) {   /* n = 0: no failure, what the others must keep */
        kv_cache *kv = kv_create(lf->n_layer, 4096, H, D, lf->page, NULL, err, sizeof err);
        cr_assert(kv, "%s", err);
        pol_env env = { kv, b, NH, H, D, global, 1, NULL, 0, NULL, NULL, NULL, NULL, 0, NULL, NULL };
        uint64_t r = lf->seed;
        fwd_fixture_random_keys(kv, lf->n_layer, lf->T, &r);
        pol_set *ps = pol_set_create(&spec, &env, err, sizeof err);
        cr_assert(ps, "%s", err);
        pol_chunk c = { q, lf->T, 0, lf->n_probe, lf->n_probe ? lf->T : 0, lf->n_probe ? pol_set_probe_tokens(ps) : 0,
                        1, 0 };
        n_calls = 0;
        fault_at = n;
        err[0] = 0;
        int rc = pol_set_layer_done(ps, 0, &c, err, sizeof err);
        reached = n == 0 || n_calls >= n;
        fault_at = 0;
        bytes_w img = { 0 };
        kv_save(kv, &img);
        cr_assert(!img.err);
        if (n == 0) {
            cr_assert_eq(rc, 0, "%s", err);
            cr_assert(kv_head_tokens(kv, 0, 0) < lf->T && kv_head_tokens(kv, 0, 1) < lf->T, "%s: nothing dropped",
                      lf->what);
            want = img;
        } else {
            if (rc) {
                lf->failed++;
                cr_expect(err[0] != 0, "%s: allocation %ld failed without a message", lf->what, n);
            } else {
                lf->same++;
                cr_expect(img.n == want.n && !memcmp(img.p, want.p, img.n),
                          "%s: allocation %ld failed and the cache kept something else", lf->what, n);
            }
            bw_free(&img);
        }
        pol_set_free(ps);
        kv_free(kv);
    }
    lf->allocs = n - 2;
    cr_log_info("%s: %ld allocations, %ld runs failed, %ld kept the same", lf->what, lf->allocs, lf->failed, lf->same);
    cr_expect_gt(lf->failed, 0, "%s: no allocation failure was reached", lf->what);
    bw_free(&want);
    free(q);
    be_free(b);
}

/* LASER-KV's block (its probe's mass and SimHash recall, then the choice): the recall's table,
 * where it cannot be had, gives way to its binary searches (the same hits). */
Test(faults, every_allocation_failure_in_laser_s_block_is_an_error_or_its_choice, .timeout = 600)
{
    layer_faults lf = { "laser:block=64,budget=0.25,protect=4,alpha=0,seed=3,rounds=3,bits=4", "laser", 2, 4, 64, 4,
                        0x1A5E, 0, 0, 0 };
    layer_done_under_faults(&lf);
}

/* Chelsea's replay at the prompt's end over two KV heads: the soft matching's blocks, when their
 * memory is short, give way to the plain formula a pair at a time (the same links). */
Test(faults, every_allocation_failure_in_chelsea_s_merge_is_an_error_or_its_merge, .timeout = 600)
{
    layer_faults lf = { "chelsea:budget=48,gap=8,sinks=4,recent=8,chunk=20,first=0", "chelsea", 1, 16, 160, 0, 0xC4E1,
                        0, 0, 0 };
    layer_done_under_faults(&lf);
    cr_expect_gt(lf.same, 0, "no allocation failure was absorbed (the soft matching's blocks)");
}
