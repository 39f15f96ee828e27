/* test_store.c - the sqlite store on real database files: schema and migrations, sessions and
 * branching messages, full-text search, snapshots round-trip through incremental blob I/O, cascade
 * deletes, and durability: a writer killed with SIGKILL at random moments during snapshot writes
 * leaves a consistent database whose previous snapshot still loads; a read-only database and a full
 * disk are clear errors; two processes writing at once do not corrupt it. */
#include <criterion/criterion.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "store/store.h"

/* In a forked child: let go of every descriptor inherited from the test runner (its event pipe),
 * so the child's death says nothing to the runner. */
static void child_detach(void)
{
    for (int fd = 3; fd < 1024; fd++) close(fd);
}

static void tmp_db(char *path, size_t cap)
{
    char dir[] = "/tmp/kvchat-store-XXXXXX";
    cr_assert(mkdtemp(dir));
    snprintf(path, cap, "%s/kvchat.db", dir);
}

static void rm_db(const char *path)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf \"$(dirname '%s')\"", path);
    cr_expect(system(cmd) == 0);
}

static store *open_ok(const char *path)
{
    char err[600];
    store *s = store_open(path, err, sizeof err);
    cr_assert(s, "%s", err);
    return s;
}

static int64_t session_fixture(store *s, const char *name)
{
    int64_t mid, did, sid;
    cr_assert(store_model_put(s, "/m/model.gguf", 1000, 7, "aa11", "gemma3", "tk1", "tiny", &mid) == 0, "%s",
              store_error(s));
    cr_assert(store_document_put(s, mid, "/d/doc.txt", "dd22", "doc.txt", 1234, &did) == 0, "%s", store_error(s));
    cr_assert(store_session_create(s, name, "About the harbour", mid, did, "chess", "0.1", "plain", &sid) == 0, "%s",
              store_error(s));
    return sid;
}

Test(store, schema_is_versioned_and_a_newer_one_is_refused)
{
    char path[600], err[600];
    tmp_db(path, sizeof path);
    store *s = open_ok(path);
    store_close(s);
    sqlite3 *db;
    cr_assert(sqlite3_open(path, &db) == SQLITE_OK);
    sqlite3_stmt *st;
    cr_assert(sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL) == SQLITE_OK);
    cr_assert(sqlite3_step(st) == SQLITE_ROW);
    cr_expect_eq(sqlite3_column_int(st, 0), STORE_SCHEMA_VERSION);
    sqlite3_finalize(st);
    cr_assert(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, NULL) == SQLITE_OK);
    cr_assert(sqlite3_step(st) == SQLITE_ROW);
    cr_expect_str_eq((const char *)sqlite3_column_text(st, 0), "wal");
    sqlite3_finalize(st);
    cr_assert(sqlite3_exec(db, "PRAGMA user_version = 99", NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(db);
    s = store_open(path, err, sizeof err);
    cr_expect(!s && strstr(err, "newer than this kvchat"), "%s", err);
    store_close(s);
    rm_db(path);
}

Test(store, sessions_messages_branches_and_search)
{
    char path[600];
    tmp_db(path, sizeof path);
    store *s = open_ok(path);
    int64_t sid = session_fixture(s, "harbour");
    int64_t u1, a1, u2, a2, u2b;
    cr_assert(store_message_add(s, sid, 0, "user", "Who rebuilt the lighthouse?", "chess", NULL, &u1) == 0);
    cr_assert(store_message_add(s, sid, u1, "assistant", "The captain rebuilt it after the storm.", "chess",
                                "{\"decode_tok_s\": 70}", &a1) == 0);
    cr_assert(store_message_add(s, sid, a1, "user", "When?", "chess", NULL, &u2) == 0);
    cr_assert(store_message_add(s, sid, u2, "assistant", "In the spring.", "chess", NULL, &a2) == 0);
    /* an edited second question branches from a1; both branches persist */
    cr_assert(store_message_add(s, sid, a1, "user", "Why did it fall?", "chess", NULL, &u2b) == 0);
    store_message *m;
    int n;
    cr_assert(store_message_path(s, a2, &m, &n) == 0, "%s", store_error(s));
    cr_assert_eq(n, 4);
    cr_expect(m[0].id == u1 && m[1].id == a1 && m[2].id == u2 && m[3].id == a2 && m[3].parent == u2);
    cr_expect_str_eq(m[1].metrics, "{\"decode_tok_s\": 70}");
    store_messages_free(m, n);
    cr_assert(store_message_path(s, u2b, &m, &n) == 0);
    cr_expect(n == 3 && m[2].id == u2b && m[1].id == a1, "the branch shares the first exchange");
    store_messages_free(m, n);
    cr_assert(store_session_messages(s, sid, &m, &n) == 0);
    cr_expect_eq(n, 5, "both branches are kept");
    store_messages_free(m, n);
    int64_t latest;
    cr_assert(store_latest_message(s, sid, &latest) == 0);
    cr_expect_eq(latest, u2b);

    store_session ss;
    cr_assert(store_session_find(s, "harbour", &ss) == 0);
    cr_expect(ss.id == sid && ss.n_messages == 5 && !strcmp(ss.doc_title, "doc.txt") && !strcmp(ss.policy, "chess"));
    char key[32];
    snprintf(key, sizeof key, "%lld", (long long)sid);
    cr_assert(store_session_find(s, key, &ss) == 0, "found by id");
    cr_expect_eq(store_session_find(s, "nope", &ss), 1);

    store_close(s);
    rm_db(path);
}

struct hits {
    int n, titles;
    int64_t last_msg;
    char snippet[256];
};

static void on_hit(void *ud, int64_t session, int64_t message, const char *snippet)
{
    struct hits *h = ud;
    (void)session;
    h->n++;
    if (message == 0) h->titles++;
    h->last_msg = message;
    snprintf(h->snippet, sizeof h->snippet, "%s", snippet);
}

Test(store, full_text_search_finds_messages_and_titles_and_follows_renames)
{
    char path[600];
    tmp_db(path, sizeof path);
    store *s = open_ok(path);
    int64_t sid = session_fixture(s, "harbour"), m1;
    cr_assert(store_message_add(s, sid, 0, "user", "Who rebuilt the lighthouse?", NULL, NULL, &m1) == 0);
    struct hits h = { 0 };
    cr_assert(store_search(s, "lighthouse", on_hit, &h) == 0, "%s", store_error(s));
    cr_expect(h.n == 1 && h.last_msg == m1 && strstr(h.snippet, "[lighthouse]"), "%d hits, '%s'", h.n, h.snippet);
    memset(&h, 0, sizeof h);
    cr_assert(store_search(s, "harbour", on_hit, &h) == 0);
    cr_expect(h.n == 1 && h.titles == 1, "the title matches");
    cr_assert(store_session_rename(s, sid, "Notes on the quay") == 0);
    memset(&h, 0, sizeof h);
    cr_assert(store_search(s, "harbour", on_hit, &h) == 0);
    cr_expect_eq(h.n, 0, "the old title is gone from the index");
    memset(&h, 0, sizeof h);
    cr_assert(store_search(s, "quay \"AND OR (", on_hit, &h) == 0, "%s", store_error(s));
    cr_expect_eq(h.n, 0, "FTS operators in the query are plain words");
    memset(&h, 0, sizeof h);
    cr_assert(store_search(s, "quay", on_hit, &h) == 0);
    cr_expect_eq(h.titles, 1);
    cr_expect(store_search(s, "   ", on_hit, &h) != 0);
    store_close(s);
    rm_db(path);
}

static unsigned char *pattern(size_t n, unsigned seed)
{
    unsigned char *p = malloc(n);
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = (unsigned char)(x >> 16);
    }
    return p;
}

Test(store, snapshots_round_trip_replace_and_cascade)
{
    char path[600];
    tmp_db(path, sizeof path);
    store *s = open_ok(path);
    int64_t sid = session_fixture(s, "snap"), m1, m2, id;
    cr_assert(store_message_add(s, sid, 0, "user", "q", NULL, NULL, &m1) == 0);
    cr_assert(store_message_add(s, sid, m1, "assistant", "a", NULL, NULL, &m2) == 0);
    size_t n = 3 * (1 << 20) + 12345;   /* several incremental-blob pieces */
    unsigned char *a = pattern(n, 1), *b = pattern(n / 2, 2);
    cr_assert(store_snapshot_put(s, sid, m2, "full", 4000, a, n, &id) == 0, "%s", store_error(s));
    cr_assert(store_snapshot_put(s, sid, m2, "snapkv:budget=0.1", 4000, b, n / 2, &id) == 0);
    void *got;
    size_t len;
    cr_assert(store_snapshot_get(s, m2, "full", &got, &len) == 0, "%s", store_error(s));
    cr_expect(len == n && !memcmp(got, a, n), "the full-cache snapshot comes back byte for byte");
    free(got);
    int64_t at;
    cr_assert(store_snapshot_latest(s, sid, "snapkv:budget=0.1", &at, &got, &len) == 0);
    cr_expect(at == m2 && len == n / 2 && !memcmp(got, b, n / 2), "one snapshot per prefill policy");
    free(got);
    cr_expect_eq(store_snapshot_get(s, m1, "full", &got, &len), 1, "none after the question");
    /* a newer snapshot for the same message and policy replaces the older */
    cr_assert(store_snapshot_put(s, sid, m2, "full", 4000, b, n / 2, &id) == 0);
    cr_assert(store_snapshot_get(s, m2, "full", &got, &len) == 0);
    cr_expect(len == n / 2);
    free(got);
    unc_event e = { 0 };
    e.step = 31;
    e.regenerated = 1;
    cr_assert(store_events_put(s, m2, &e, 1) == 0, "%s", store_error(s));
    unc_thresholds t = { 0 }, u;
    t.valid = 1;
    t.h_mean = 1.5;
    t.h_var = 2;
    t.n_heads = 1;
    t.head_sim[0] = (unc_head_sim){ 5, 0, 0.9f };
    store_session ss;
    cr_assert(store_session_get(s, sid, &ss) == 0);
    cr_assert(store_thresholds_put(s, ss.model_id, &t) == 0, "%s", store_error(s));
    cr_assert(store_thresholds_get(s, ss.model_id, &u) == 0);
    cr_expect(u.valid && u.h_mean == 1.5 && u.n_heads == 1 && u.head_sim[0].layer == 5);
    /* deleting the session removes its messages, snapshots and events */
    cr_assert(store_session_delete(s, sid) == 0);
    cr_expect_eq(store_snapshot_get(s, m2, "full", &got, &len), 1);
    int64_t ne = -1;
    cr_assert(store_event_count(s, m2, &ne) == 0);
    cr_expect_eq(ne, 0);
    cr_expect(store_session_delete(s, sid) != 0 && strstr(store_error(s), "no session"));
    cr_expect_eq(store_check(s), 0);
    store_close(s);
    free(a);
    free(b);
    rm_db(path);
}

/* A child writes snapshots in a loop (each a recognizable pattern whose first 8 bytes are its
 * seed); the parent kills it with SIGKILL at a random moment. The database must pass the integrity
 * check and the newest snapshot must be one complete pattern. */
Test(store, kill_during_snapshot_writes_leaves_the_previous_snapshot, .timeout = 120)
{
    char path[600];
    tmp_db(path, sizeof path);
    store *s = open_ok(path);
    int64_t sid = session_fixture(s, "crash"), m1;
    cr_assert(store_message_add(s, sid, 0, "user", "q", NULL, NULL, &m1) == 0);
    size_t n = 2 * (1 << 20) + 777;
    unsigned char *first = pattern(n, 1000);
    int64_t id;
    cr_assert(store_snapshot_put(s, sid, m1, "full", 1000, first, n, &id) == 0);   /* n_tokens carries the seed */
    store_close(s);
    free(first);
    srand((unsigned)time(NULL));
    for (int round = 0; round < 6; round++) {
        pid_t pid = fork();
        cr_assert(pid >= 0);
        if (pid == 0) {
            child_detach();
            char err[600];
            store *c = store_open(path, err, sizeof err);
            if (!c) _exit(3);
            for (unsigned k = 1;; k++) {
                unsigned seed = 1000 + round * 100000 + k;
                unsigned char *p = pattern(n, seed);
                int64_t cid;
                if (store_snapshot_put(c, sid, m1, "full", seed, p, n, &cid) != 0) _exit(4);
                free(p);
            }
        }
        usleep((useconds_t)(20000 + rand() % 200000));
        kill(pid, SIGKILL);
        int st;
        waitpid(pid, &st, 0);
        cr_assert(WIFSIGNALED(st), "round %d: the writer exited on its own (%d)", round, WEXITSTATUS(st));
        s = open_ok(path);
        cr_expect_eq(store_check(s), 0, "round %d: %s", round, store_error(s));
        void *got;
        size_t len;
        int64_t at;
        cr_assert(store_snapshot_latest(s, sid, "full", &at, &got, &len) == 0, "round %d: %s", round, store_error(s));
        cr_assert_eq(len, n);
        /* whichever write committed last, it is whole: regenerate it from its seed (n_tokens column
         * is the seed) and compare */
        sqlite3 *db;
        cr_assert(sqlite3_open(path, &db) == SQLITE_OK);
        sqlite3_stmt *q;
        cr_assert(sqlite3_prepare_v2(db, "SELECT n_tokens FROM snapshots WHERE message_id = ?", -1, &q, NULL) ==
                  SQLITE_OK);
        sqlite3_bind_int64(q, 1, m1);
        cr_assert(sqlite3_step(q) == SQLITE_ROW);
        unsigned seed = (unsigned)sqlite3_column_int64(q, 0);
        sqlite3_finalize(q);
        sqlite3_close(db);
        unsigned char *want = pattern(n, seed);
        cr_expect(!memcmp(want, got, n), "round %d: the surviving snapshot (seed %u) is not whole", round, seed);
        free(want);
        free(got);
        store_close(s);
    }
    rm_db(path);
}

Test(store, read_only_database_and_full_disk_are_clear_errors, .timeout = 60)
{
    char path[600], err[600];
    tmp_db(path, sizeof path);
    store *s = open_ok(path);
    int64_t sid = session_fixture(s, "ro"), m1, m0;
    cr_assert(store_message_add(s, sid, 0, "user", "q0", NULL, NULL, &m0) == 0);
    store_close(s);
    /* read-only: opened through sqlite's read-only URI (file permissions do not stop root) */
    char uri[700];
    snprintf(uri, sizeof uri, "file:%s?mode=ro", path);
    s = store_open(uri, err, sizeof err);
    cr_assert(s, "a read-only database still opens for browsing: %s", err);
    store_session ss;
    cr_expect_eq(store_session_find(s, "ro", &ss), 0);
    int rc = store_message_add(s, sid, 0, "user", "q", NULL, NULL, &m1);
    cr_expect(rc != 0 && strstr(store_error(s), "read-only"), "%s", store_error(s));
    store_close(s);
    /* a full disk, made with a file size limit in a child: the write fails with a clear error and
     * the database stays consistent */
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        child_detach();
        signal(SIGXFSZ, SIG_IGN);
        store *c = store_open(path, err, sizeof err);
        if (!c) _exit(3);
        struct stat stt;
        stat(path, &stt);
        struct rlimit rl = { (rlim_t)stt.st_size + 65536, (rlim_t)stt.st_size + 65536 };
        setrlimit(RLIMIT_FSIZE, &rl);
        size_t n = 8 << 20;
        unsigned char *p = pattern(n, 9);
        int64_t id;
        int wrc = store_snapshot_put(c, sid, m0, "full", 1, p, n, &id);
        if (wrc == 0) _exit(5);
        _exit(strstr(store_error(c), "saving the snapshot: ") &&
                      (strstr(store_error(c), "full") || strstr(store_error(c), "too large"))
                  ? 0
                  : 6);
    }
    int st;
    waitpid(pid, &st, 0);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the oversized write did not fail cleanly (%d)", WEXITSTATUS(st));
    s = open_ok(path);
    cr_expect_eq(store_check(s), 0, "%s", store_error(s));
    store_close(s);
    rm_db(path);
}

Test(store, two_processes_writing_at_once_do_not_corrupt_it, .timeout = 120)
{
    char path[600];
    tmp_db(path, sizeof path);
    store *s = open_ok(path);
    int64_t sid = session_fixture(s, "two");
    store_close(s);
    pid_t kids[2];
    for (int k = 0; k < 2; k++) {
        kids[k] = fork();
        cr_assert(kids[k] >= 0);
        if (kids[k] == 0) {
            child_detach();
            char err[600];
            store *c = store_open(path, err, sizeof err);
            if (!c) _exit(3);
            int64_t parent = 0, id;
            for (int i = 0; i < 60; i++) {
                char text[64];
                snprintf(text, sizeof text, "writer %d message %d", k, i);
                if (store_message_add(c, sid, parent, i % 2 ? "assistant" : "user", text, NULL, NULL, &id)) _exit(4);
                parent = id;
                if (i % 10 == 9) {
                    unsigned char *p = pattern(300000, (unsigned)(k * 1000 + i));
                    if (store_snapshot_put(c, sid, id, "full", i, p, 300000, &id)) _exit(5);
                    free(p);
                }
            }
            store_close(c);
            _exit(0);
        }
    }
    for (int k = 0; k < 2; k++) {
        int st;
        waitpid(kids[k], &st, 0);
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "writer %d failed (%d)", k, WEXITSTATUS(st));
    }
    s = open_ok(path);
    cr_expect_eq(store_check(s), 0);
    store_message *m;
    int n;
    cr_assert(store_session_messages(s, sid, &m, &n) == 0);
    cr_expect_eq(n, 120, "every message of both writers is there");
    store_messages_free(m, n);
    store_close(s);
    rm_db(path);
}

static int64_t count_rows(const char *path, const char *sql)
{
    sqlite3 *db;
    sqlite3_stmt *st;
    cr_assert(sqlite3_open(path, &db) == SQLITE_OK);
    cr_assert(sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK, "%s", sqlite3_errmsg(db));
    cr_assert(sqlite3_step(st) == SQLITE_ROW);
    int64_t n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return n;
}

/* Issue 27, item 8: over the size limit, the oldest snapshots go first after each save (never the
 * one just saved, never a message), until the pages in use fit; the count of pruned snapshots is
 * kept, and the free pages are reused, so the file stays near the limit. */
Test(store, size_limit_prunes_the_oldest_snapshots_first_and_keeps_messages)
{
    char path[600];
    tmp_db(path, sizeof path);
    store *s = open_ok(path);
    store_usage u;
    cr_assert(store_usage_get(s, &u) == 0, "%s", store_error(s));
    cr_expect_eq(u.limit, STORE_DEFAULT_LIMIT, "1 GiB unless set");
    int64_t limit = 3 * (1 << 20);
    cr_assert(store_limit_set(s, limit) == 0, "%s", store_error(s));
    int64_t sid = session_fixture(s, "big"), other = session_fixture(s, "other"), parent = 0, snap[12];
    size_t n = (1 << 20) + 4321;   /* about a third of the limit: the fourth save is over it */
    for (int i = 0; i < 12; i++) {
        int64_t q, a;
        int64_t in = i % 3 == 2 ? other : sid;   /* two sessions: the oldest goes, whichever it is */
        cr_assert(store_message_add(s, in, in == sid ? parent : 0, "user", "q", NULL, NULL, &q) == 0);
        cr_assert(store_message_add(s, in, q, "assistant", "a", NULL, NULL, &a) == 0);
        if (in == sid) parent = a;
        unsigned char *p = pattern(n, (uint32_t)i + 1);
        cr_assert(store_snapshot_put(s, in, a, "full", 100, p, n, &snap[i]) == 0, "%s", store_error(s));
        free(p);
        cr_assert(store_usage_get(s, &u) == 0);
        cr_expect(u.used <= limit, "save %d: %lld bytes in use over the %lld limit", i, (long long)u.used,
                  (long long)limit);
        /* the snapshots left are the newest ones, the one just saved among them */
        int64_t left = u.n_snapshots, oldest_left = snap[i - left + 1];
        char sql[200];
        snprintf(sql, sizeof sql, "SELECT COUNT(*) FROM snapshots WHERE id >= %lld", (long long)oldest_left);
        cr_expect_eq(count_rows(path, sql), left, "save %d: a newer snapshot went before an older one", i);
        cr_expect_eq(u.pruned, i + 1 - left, "save %d: the pruned count", i);
    }
    cr_expect(u.pruned >= 8, "12 snapshots of a third of the limit: at most 3 stay (%lld pruned)", (long long)u.pruned);
    cr_expect_eq(count_rows(path, "SELECT COUNT(*) FROM messages"), 24, "every message is kept");
    cr_expect_eq(count_rows(path, "SELECT COUNT(*) FROM chunks WHERE NOT EXISTS (SELECT 1 FROM snapshot_chunks sc "
                                  "WHERE sc.hash = chunks.hash)"),
                 0, "no page is left that no snapshot holds");
    cr_expect(u.file <= limit + 2 * (int64_t)n, "the file reuses free pages: %lld bytes", (long long)u.file);
    /* one snapshot bigger than the limit stays (it is the one just saved), alone */
    cr_assert(store_limit_set(s, 100 * 1024) == 0);
    int64_t q, a, id;
    cr_assert(store_message_add(s, sid, parent, "user", "q", NULL, NULL, &q) == 0);
    cr_assert(store_message_add(s, sid, q, "assistant", "a", NULL, NULL, &a) == 0);
    unsigned char *p = pattern(n, 99);
    cr_assert(store_snapshot_put(s, sid, a, "full", 100, p, n, &id) == 0, "%s", store_error(s));
    void *got;
    size_t len;
    cr_assert(store_snapshot_get(s, a, "full", &got, &len) == 0);
    cr_expect(len == n && !memcmp(got, p, n));
    free(got);
    free(p);
    cr_assert(store_usage_get(s, &u) == 0);
    cr_expect_eq(u.n_snapshots, 1);
    /* off: nothing is pruned */
    cr_assert(store_limit_set(s, 0) == 0);
    cr_assert(store_message_add(s, sid, a, "user", "q", NULL, NULL, &q) == 0);
    cr_assert(store_message_add(s, sid, q, "assistant", "a", NULL, NULL, &a) == 0);
    p = pattern(n, 100);
    cr_assert(store_snapshot_put(s, sid, a, "full", 100, p, n, &id) == 0, "%s", store_error(s));
    free(p);
    cr_assert(store_usage_get(s, &u) == 0);
    cr_expect_eq(u.n_snapshots, 2);
    cr_expect_eq(store_check(s), 0);
    store_close(s);
    rm_db(path);
}

Test(store, sizes_parse_with_units_and_refuse_the_rest)
{
    int64_t b;
    char err[300];
    cr_expect(store_size_parse("1G", &b, err, sizeof err) == 0 && b == (1LL << 30));
    cr_expect(store_size_parse("800M", &b, err, sizeof err) == 0 && b == 800LL << 20);
    cr_expect(store_size_parse("1.5GiB", &b, err, sizeof err) == 0 && b == 3LL << 29);
    cr_expect(store_size_parse("4096", &b, err, sizeof err) == 0 && b == 4096);
    cr_expect(store_size_parse("off", &b, err, sizeof err) == 0 && b == 0);
    const char *bad[] = { "", "-1G", "12Q", "G", "1G2", "nan", "1e30" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_expect(store_size_parse(bad[i], &b, err, sizeof err) == -1, "'%s' was taken", bad[i]);
        cr_expect(strstr(err, "is not a size"), "%s", err);
    }
}

/* Issue 27: a session a live kvchat holds is seen by another process; a hold of a process that has
 * exited is ignored; closing the store lets go. */
Test(store, holds_name_a_live_process_and_stale_ones_are_ignored, .timeout = 60)
{
    char path[600];
    tmp_db(path, sizeof path);
    store *s = open_ok(path);
    int64_t sid = session_fixture(s, "held"), pid = 0;
    int go[2], ready[2];
    cr_assert(pipe(go) == 0 && pipe(ready) == 0);
    pid_t c = fork();
    if (c == 0) {
        char err[600], ch = 1;
        store *cs = store_open(path, err, sizeof err);
        int ok = cs && store_hold(cs, sid) == 0;
        if (write(ready[1], &ch, 1) != 1) _exit(3);
        if (read(go[0], &ch, 1) != 1) _exit(3);
        if (ch == 'c') store_close(cs);   /* 'c': let go; else die holding it */
        _exit(ok ? 0 : 2);
    }
    char ch;
    cr_assert(read(ready[0], &ch, 1) == 1);
    cr_expect_eq(store_hold_other(s, sid, &pid), 1, "%s", store_error(s));
    cr_expect_eq(pid, c);
    cr_expect_eq(store_hold_other(s, 0, &pid), 1, "any session");
    cr_expect_eq(store_vacuum(s), -1, "a vacuum is refused while another kvchat holds a session");
    cr_expect(strstr(store_error(s), "another kvchat (pid"), "%s", store_error(s));
    /* the holder dies without letting go: its row stays, and is ignored */
    ch = 'k';
    cr_assert(write(go[1], &ch, 1) == 1);
    int st;
    waitpid(c, &st, 0);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    cr_expect_eq(count_rows(path, "SELECT COUNT(*) FROM holds"), 1);
    cr_expect_eq(store_hold_other(s, sid, &pid), 0, "a dead process's hold is stale");
    cr_expect_eq(count_rows(path, "SELECT COUNT(*) FROM holds WHERE started > 0"), 1, "a hold names the start time");
    /* a pid the system has given to another process since (pid 1 did not start at tick 7) */
    sqlite3 *raw;
    cr_assert(sqlite3_open(path, &raw) == SQLITE_OK);
    char ins[200];
    snprintf(ins, sizeof ins, "INSERT INTO holds VALUES (%lld, 1, 7, 0)", (long long)sid);
    cr_assert(sqlite3_exec(raw, ins, NULL, NULL, NULL) == SQLITE_OK, "%s", sqlite3_errmsg(raw));
    sqlite3_close(raw);
    cr_expect_eq(store_hold_other(s, sid, &pid), 0, "a reused pid does not hold");
    /* a read-only connection resumes without a hold (it saves nothing, so it forks nothing) */
    char uri[700];
    snprintf(uri, sizeof uri, "file:%s?mode=ro", path);
    store *ro = open_ok(uri);
    cr_expect_eq(store_hold(ro, sid), 0, "%s", store_error(ro));
    store_close(ro);
    /* its own hold is not another's; closing lets go */
    cr_assert(store_hold(s, sid) == 0, "%s", store_error(s));
    cr_expect_eq(store_hold_other(s, sid, &pid), 0);
    store_close(s);
    char sql[120];
    snprintf(sql, sizeof sql, "SELECT COUNT(*) FROM holds WHERE pid = %lld", (long long)getpid());
    cr_expect_eq(count_rows(path, sql), 0, "closing the store removes its hold");
    close(go[0]);
    close(go[1]);
    close(ready[0]);
    close(ready[1]);
    rm_db(path);
}

static int64_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (int64_t)st.st_size : 0;
}

/* Issue 27: vacuum while another connection has the database open shrinks the file and leaves no
 * write-ahead log behind (the copy used to wait in the log, which grew instead). */
Test(store, vacuum_with_another_connection_open_shrinks_the_file)
{
    char path[600], wal[700];
    tmp_db(path, sizeof path);
    snprintf(wal, sizeof wal, "%s-wal", path);
    store *s = open_ok(path), *other = open_ok(path);
    int64_t sid = session_fixture(s, "big"), m, id;
    cr_assert(store_message_add(s, sid, 0, "user", "q", NULL, NULL, &m) == 0);
    size_t n = 8u << 20;
    unsigned char *p = pattern(n, 5);
    cr_assert(store_snapshot_put(s, sid, m, "full", 100, p, n, &id) == 0, "%s", store_error(s));
    free(p);
    store_session ss;
    cr_assert(store_session_get(other, sid, &ss) == 0, "the other connection reads");
    cr_assert(store_session_delete(s, sid) == 0);
    cr_assert(store_vacuum(s) == 0, "%s", store_error(s));
    cr_expect(file_size(path) < (1 << 20), "the file is %lld bytes after the vacuum", (long long)file_size(path));
    cr_expect(file_size(wal) == 0, "the log is %lld bytes after the vacuum", (long long)file_size(wal));
    cr_expect_eq(store_check(other), 0);
    store_close(other);
    store_close(s);
    rm_db(path);
}

/* Issue 27: pruning and deleting write little: a freed page is not overwritten with zeros first
 * (secure_delete = FAST; Debian's sqlite zeroes by default, which wrote a deleted 8 MiB snapshot
 * into the write-ahead log again, 8 MiB of zeros, on every prune). */
Test(store, deleting_a_snapshot_does_not_rewrite_its_pages)
{
    char path[600], wal[700];
    tmp_db(path, sizeof path);
    snprintf(wal, sizeof wal, "%s-wal", path);
    store *s = open_ok(path);
    int64_t sid = session_fixture(s, "big"), m, id;
    cr_assert(store_message_add(s, sid, 0, "user", "q", NULL, NULL, &m) == 0);
    size_t n = 8u << 20;
    unsigned char *p = pattern(n, 6);
    cr_assert(store_snapshot_put(s, sid, m, "full", 100, p, n, &id) == 0, "%s", store_error(s));
    free(p);
    sqlite3 *raw;
    cr_assert(sqlite3_open(path, &raw) == SQLITE_OK);
    cr_assert(sqlite3_exec(raw, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL) == SQLITE_OK);
    cr_expect_eq(file_size(wal), 0);
    cr_assert(store_session_delete(s, sid) == 0, "%s", store_error(s));
    cr_expect(file_size(wal) < (1 << 20), "deleting an 8 MiB snapshot wrote %lld bytes to the log",
              (long long)file_size(wal));
    sqlite3_close(raw);
    store_close(s);
    rm_db(path);
}
