/* store.c - the sqlite database behind sessions, messages and snapshots. */
#include "store/store.h"

#include <errno.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <signal.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "common/files.h"
#include "engine/snapshot.h"

struct store {
    sqlite3 *db;
    int64_t held;            /* the session this connection holds (store_hold), 0: none */
    char err[512];
};

static int fail(store *s, const char *what)
{
    const char *m = s->db ? sqlite3_errmsg(s->db) : "out of memory";
    int code = s->db ? sqlite3_extended_errcode(s->db) : SQLITE_NOMEM;
    if ((code & 0xff) == SQLITE_FULL)
        snprintf(s->err, sizeof s->err, "%s: the disk is full (%s)", what, m);
    else if ((code & 0xff) == SQLITE_READONLY)
        snprintf(s->err, sizeof s->err, "%s: the database is read-only (%s)", what, m);
    else if ((code & 0xff) == SQLITE_BUSY)
        snprintf(s->err, sizeof s->err, "%s: the database is locked by another process (%s)", what, m);
    else if ((code & 0xff) == SQLITE_IOERR && sqlite3_system_errno(s->db))
        snprintf(s->err, sizeof s->err, "%s: %s (%s)", what, m, strerror(sqlite3_system_errno(s->db)));
    else
        snprintf(s->err, sizeof s->err, "%s: %s", what, m);
    return -1;
}

const char *store_error(const store *s) { return s->err; }

static int64_t now_s(void) { return (int64_t)time(NULL); }

/* Prepare sql and bind the arguments described by fmt: i = int64, t = text (NULL binds NULL),
 * d = double, b = blob (pointer, int length). */
static sqlite3_stmt *prep(store *s, const char *sql, const char *fmt, ...)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK) {
        fail(s, "database");
        return NULL;
    }
    va_list ap;
    va_start(ap, fmt);
    for (int i = 0; fmt && fmt[i]; i++) {
        int rc = SQLITE_OK;
        switch (fmt[i]) {
        case 'i':
            rc = sqlite3_bind_int64(st, i + 1, va_arg(ap, int64_t));
            break;
        case 't': {
            const char *t = va_arg(ap, const char *);
            rc = t ? sqlite3_bind_text(st, i + 1, t, -1, SQLITE_TRANSIENT) : sqlite3_bind_null(st, i + 1);
            break;
        }
        case 'd':
            rc = sqlite3_bind_double(st, i + 1, va_arg(ap, double));
            break;
        case 'b': {
            const void *p = va_arg(ap, const void *);
            int n = va_arg(ap, int);
            rc = sqlite3_bind_blob(st, i + 1, p, n, SQLITE_TRANSIENT);
            break;
        }
        }
        if (rc != SQLITE_OK) {
            va_end(ap);
            fail(s, "database");
            sqlite3_finalize(st);
            return NULL;
        }
    }
    va_end(ap);
    return st;
}

/* Run a statement that returns no rows. */
static int exec_stmt(store *s, sqlite3_stmt *st, const char *what)
{
    if (!st) return -1;
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE || rc == SQLITE_ROW ? 0 : fail(s, what);
}

static int exec_sql(store *s, const char *sql, const char *what)
{
    char *msg = NULL;
    if (sqlite3_exec(s->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        snprintf(s->err, sizeof s->err, "%s: %s", what, msg ? msg : sqlite3_errmsg(s->db));
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}

/* Switching a new file to WAL needs a moment of exclusive access, and sqlite answers SQLITE_BUSY
 * there without calling the busy handler when another process is opening the same new file; so
 * this waits itself, as long as the busy timeout would (10 s), then fails like any other busy. */
static int set_wal_mode(store *s)
{
    for (int waited_ms = 0;; waited_ms += 5) {
        int rc = sqlite3_exec(s->db, "PRAGMA journal_mode = WAL", NULL, NULL, NULL);
        if (rc == SQLITE_OK) return 0;
        if ((rc & 0xff) != SQLITE_BUSY || waited_ms >= 10000) {
            snprintf(s->err, sizeof s->err, "opening the database: %s", sqlite3_errmsg(s->db));
            return -1;
        }
        sqlite3_sleep(5);
    }
}

static void copy_col(sqlite3_stmt *st, int c, char *dst, size_t cap)
{
    const unsigned char *t = sqlite3_column_text(st, c);
    snprintf(dst, cap, "%s", t ? (const char *)t : "");
}

/* ------------------------------------------------------------------------------------ schema */

/* Migration i takes the schema from version i to i + 1. */
/* Chunks no snapshot refers to any more (after snapshots or sessions were deleted). */
static int drop_orphan_chunks(store *s, const char *what)
{
    return exec_sql(s, "DELETE FROM chunks WHERE NOT EXISTS (SELECT 1 FROM snapshot_chunks sc WHERE sc.hash = chunks.hash) "
                    "AND NOT EXISTS (SELECT 1 FROM document_snapshot_chunks dc WHERE dc.hash = chunks.hash)",
                    what);
}

static const char *const migrations[] = {
    "CREATE TABLE models ("
    "  id INTEGER PRIMARY KEY,"
    "  path TEXT NOT NULL,"
    "  size INTEGER NOT NULL,"
    "  mtime INTEGER NOT NULL,"
    "  sha256 TEXT NOT NULL UNIQUE,"
    "  architecture TEXT NOT NULL,"
    "  tokenizer_hash TEXT NOT NULL,"
    "  name TEXT,"
    "  added_at INTEGER NOT NULL);"
    "CREATE TABLE documents ("
    "  id INTEGER PRIMARY KEY,"
    "  model_id INTEGER NOT NULL REFERENCES models(id) ON DELETE CASCADE,"
    "  path TEXT,"
    "  sha256 TEXT NOT NULL,"
    "  title TEXT NOT NULL,"
    "  n_tokens INTEGER NOT NULL,"
    "  added_at INTEGER NOT NULL,"
    "  UNIQUE (model_id, sha256));"
    "CREATE TABLE sessions ("
    "  id INTEGER PRIMARY KEY,"
    "  name TEXT UNIQUE,"
    "  title TEXT NOT NULL,"
    "  model_id INTEGER NOT NULL REFERENCES models(id),"
    "  document_id INTEGER REFERENCES documents(id),"
    "  policy TEXT NOT NULL,"
    "  budget TEXT,"
    "  prompt_format TEXT NOT NULL,"
    "  created_at INTEGER NOT NULL,"
    "  updated_at INTEGER NOT NULL);"
    "CREATE TABLE messages ("
    "  id INTEGER PRIMARY KEY,"
    "  session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,"
    "  parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE,"
    "  role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),"
    "  text TEXT NOT NULL,"
    "  policy TEXT,"
    "  metrics TEXT,"
    "  created_at INTEGER NOT NULL);"
    "CREATE INDEX messages_session ON messages(session_id, id);"
    "CREATE INDEX messages_parent ON messages(parent_id);"
    "CREATE TABLE snapshots ("
    "  id INTEGER PRIMARY KEY,"
    "  session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,"
    "  message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,"
    "  prefill_policy TEXT NOT NULL,"
    "  n_tokens INTEGER NOT NULL,"
    "  bytes INTEGER NOT NULL,"
    "  data BLOB NOT NULL,"
    "  created_at INTEGER NOT NULL,"
    "  UNIQUE (message_id, prefill_policy));"
    "CREATE INDEX snapshots_session ON snapshots(session_id, id);"
    "CREATE TABLE thresholds ("
    "  model_id INTEGER PRIMARY KEY REFERENCES models(id) ON DELETE CASCADE,"
    "  entropy_mean REAL NOT NULL,"
    "  entropy_var REAL NOT NULL,"
    "  quantile REAL,"
    "  page INTEGER,"
    "  samples INTEGER,"
    "  seed INTEGER,"
    "  head_similarity TEXT,"
    "  created_at INTEGER NOT NULL);"
    "CREATE TABLE events ("
    "  id INTEGER PRIMARY KEY,"
    "  message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,"
    "  step INTEGER NOT NULL, pos INTEGER NOT NULL, page INTEGER NOT NULL,"
    "  mean_h REAL NOT NULL, var_h REAL NOT NULL, thr_h REAL NOT NULL, thr_v REAL NOT NULL,"
    "  pages_added TEXT, pages_removed TEXT,"
    "  regenerated INTEGER NOT NULL, recovered INTEGER NOT NULL,"
    "  after_mean_h REAL, after_var_h REAL);"
    "CREATE INDEX events_message ON events(message_id);"
    /* full-text search: external-content FTS5 tables kept in step by triggers */
    "CREATE VIRTUAL TABLE messages_fts USING fts5(text, content='messages', content_rowid='id');"
    "CREATE TRIGGER messages_ai AFTER INSERT ON messages BEGIN"
    "  INSERT INTO messages_fts(rowid, text) VALUES (new.id, new.text); END;"
    "CREATE TRIGGER messages_ad AFTER DELETE ON messages BEGIN"
    "  INSERT INTO messages_fts(messages_fts, rowid, text) VALUES ('delete', old.id, old.text); END;"
    "CREATE VIRTUAL TABLE sessions_fts USING fts5(title, content='sessions', content_rowid='id');"
    "CREATE TRIGGER sessions_ai AFTER INSERT ON sessions BEGIN"
    "  INSERT INTO sessions_fts(rowid, title) VALUES (new.id, new.title); END;"
    "CREATE TRIGGER sessions_ad AFTER DELETE ON sessions BEGIN"
    "  INSERT INTO sessions_fts(sessions_fts, rowid, title) VALUES ('delete', old.id, old.title); END;"
    "CREATE TRIGGER sessions_au AFTER UPDATE OF title ON sessions BEGIN"
    "  INSERT INTO sessions_fts(sessions_fts, rowid, title) VALUES ('delete', old.id, old.title);"
    "  INSERT INTO sessions_fts(rowid, title) VALUES (new.id, new.title); END;",
    /* 2: a snapshot's KV pages are stored once by content (sha256) and shared by every snapshot that
     * holds them; snapshots.data keeps the rest (the skeleton) and snapshot_chunks where each page
     * goes back. A snapshot with no chunk rows is whole in snapshots.data (written before). */
    "CREATE TABLE chunks ("
    "  hash TEXT PRIMARY KEY,"
    "  data BLOB NOT NULL);"
    "CREATE TABLE snapshot_chunks ("
    "  snapshot_id INTEGER NOT NULL REFERENCES snapshots(id) ON DELETE CASCADE,"
    "  off INTEGER NOT NULL,"
    "  bytes INTEGER NOT NULL,"
    "  hash TEXT NOT NULL REFERENCES chunks(hash),"
    "  PRIMARY KEY (snapshot_id, off)) WITHOUT ROWID;"
    "CREATE INDEX snapshot_chunks_hash ON snapshot_chunks(hash);"
    "ALTER TABLE snapshots ADD COLUMN stored INTEGER;",
    /* 3: a document's cache right after it was read, shared by content: any conversation about the
     * same text (any path, any session) under the same prefill policy and prompt form starts from it
     * instead of reading the document again. Its pages are chunks like a snapshot's. */
    "CREATE TABLE document_snapshots ("
    "  id INTEGER PRIMARY KEY,"
    "  document_id INTEGER NOT NULL REFERENCES documents(id) ON DELETE CASCADE,"
    "  prefill_policy TEXT NOT NULL,"
    "  n_tokens INTEGER NOT NULL,"
    "  bytes INTEGER NOT NULL,"
    "  data BLOB NOT NULL,"
    "  stored INTEGER,"
    "  created_at INTEGER NOT NULL,"
    "  used_at INTEGER NOT NULL,"
    "  UNIQUE (document_id, prefill_policy));"
    "CREATE TABLE document_snapshot_chunks ("
    "  snapshot_id INTEGER NOT NULL REFERENCES document_snapshots(id) ON DELETE CASCADE,"
    "  off INTEGER NOT NULL,"
    "  bytes INTEGER NOT NULL,"
    "  hash TEXT NOT NULL REFERENCES chunks(hash),"
    "  PRIMARY KEY (snapshot_id, off)) WITHOUT ROWID;"
    "CREATE INDEX document_snapshot_chunks_hash ON document_snapshot_chunks(hash);"
    /* also 3: the database's own settings (its size limit, how many snapshots the limit pruned) and
     * the holds: which kvchat process has which session open, so another one does not fork it unseen */
    "CREATE TABLE meta ("
    "  key TEXT PRIMARY KEY,"
    "  value INTEGER NOT NULL);"
    "CREATE TABLE holds ("
    "  session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,"
    "  pid INTEGER NOT NULL,"
    "  started INTEGER NOT NULL,"
    "  created_at INTEGER NOT NULL,"
    "  PRIMARY KEY (session_id, pid));",
};

static int schema_version(store *s)
{
    sqlite3_stmt *st = prep(s, "PRAGMA user_version", NULL);
    if (!st) return -1;
    int v = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int(st, 0) : -1;
    sqlite3_finalize(st);
    return v;
}

/* One migration step at a time, each in a write transaction that reads the version itself: a
 * process that waited for another one's migration sees the version it left and goes on from there
 * (reading it before taking the lock let two processes both migrate a fresh file). */
static int migrate(store *s)
{
    int n = (int)(sizeof migrations / sizeof *migrations);
    if (schema_version(s) == n) return 0;   /* the common case, without a write lock */
    for (;;) {
        if (exec_sql(s, "BEGIN IMMEDIATE", "migrating the database")) return -1;
        int v = schema_version(s);
        char ver[64];
        snprintf(ver, sizeof ver, "PRAGMA user_version = %d", v + 1);
        if (v < 0 || v > n) {
            sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
            if (v < 0) return fail(s, "reading the schema version");
            snprintf(s->err, sizeof s->err, "the database has schema version %d, newer than this kvchat (%d)", v, n);
            return -1;
        }
        if (v < n && (exec_sql(s, migrations[v], "migrating the database") || exec_sql(s, ver, "migrating the database"))) {
            sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
            return -1;
        }
        if (exec_sql(s, "COMMIT", "migrating the database")) {
            sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
            return -1;
        }
        if (v + 1 >= n) return 0;
    }
}

int store_data_dir(char *buf, size_t cap, int create)
{
    const char *xdg = getenv("XDG_DATA_HOME"), *home = getenv("HOME");
    if (xdg && *xdg)
        snprintf(buf, cap, "%s/kvchat", xdg);
    else if (home && *home)
        snprintf(buf, cap, "%s/.local/share/kvchat", home);
    else
        return -1;
    if (!create) return 0;
    for (char *p = buf + 1; *p; p++) {   /* mkdir -p */
        if (*p != '/') continue;
        *p = 0;
        mkdir(buf, 0755);
        *p = '/';
    }
    return mkdir(buf, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

int store_default_path(char *buf, size_t cap, int create)
{
    char dir[900];
    if (store_data_dir(dir, sizeof dir, create)) return -1;
    snprintf(buf, cap, "%s/kvchat.db", dir);
    return 0;
}

store *store_open(const char *path, char *err, size_t errlen)
{
    store *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_URI, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "cannot open the database %s: %s", path, s->db ? sqlite3_errmsg(s->db) : "out of memory");
        store_close(s);
        return NULL;
    }
    sqlite3_busy_timeout(s->db, 10000);   /* another kvchat writing: wait, do not fail */
    sqlite3_extended_result_codes(s->db, 1);
    /* journal_mode=WAL needs write access; a read-only file keeps its mode and fails on write */
    int ro = sqlite3_db_readonly(s->db, "main") == 1;   /* browsing still works; writes fail clearly */
    if (exec_sql(s, "PRAGMA foreign_keys = ON", "opening the database") ||
        (!ro && set_wal_mode(s)) ||
        exec_sql(s, "PRAGMA synchronous = NORMAL", "opening the database") ||
        /* a freed page is not zeroed first where that costs a write: pruning an 8 MiB snapshot
         * wrote 8 MiB of zeros through the log (Debian's sqlite is built with secure_delete on) */
        exec_sql(s, "PRAGMA secure_delete = FAST", "opening the database") || migrate(s)) {
        snprintf(err, errlen, "%s: %s", path, s->err);
        store_close(s);
        return NULL;
    }
    return s;
}

void store_close(store *s)
{
    if (!s) return;
    if (s->held) store_hold(s, 0);   /* best effort: a hold left behind names a dead pid, ignored */
    sqlite3_close_v2(s->db);
    free(s);
}

int store_check(store *s)
{
    sqlite3_stmt *st = prep(s, "PRAGMA integrity_check", NULL);
    if (!st) return -1;
    int ok = sqlite3_step(st) == SQLITE_ROW && !strcmp((const char *)sqlite3_column_text(st, 0), "ok");
    if (!ok) snprintf(s->err, sizeof s->err, "integrity check failed: %s", sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    return ok ? 0 : -1;
}

/* ------------------------------------------------------------------------------- models, docs */

int store_model_cached_sha(store *s, const char *path, int64_t size, int64_t mtime, char sha[65])
{
    sqlite3_stmt *st = prep(s, "SELECT sha256 FROM models WHERE path = ? AND size = ? AND mtime = ?", "tii", path,
                            size, mtime);
    if (!st) return -1;
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        copy_col(st, 0, sha, 65);
        rc = 0;
    } else {
        rc = rc == SQLITE_DONE ? 1 : fail(s, "looking up the model");
    }
    sqlite3_finalize(st);
    return rc;
}

static int last_id_or_lookup(store *s, const char *sql, const char *fmt, const char *a, int64_t b, int64_t *id)
{
    sqlite3_stmt *st = fmt[0] == 't' && fmt[1] == 0 ? prep(s, sql, "t", a) : prep(s, sql, "it", b, a);
    if (!st) return -1;
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) *id = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return rc == SQLITE_ROW ? 0 : fail(s, "looking up a row");
}

int store_model_put(store *s, const char *path, int64_t size, int64_t mtime, const char *sha256, const char *arch,
                    const char *tokenizer_hash, const char *name, int64_t *id)
{
    sqlite3_stmt *st = prep(s,
                            "INSERT INTO models (path, size, mtime, sha256, architecture, tokenizer_hash, name, added_at) "
                            "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (sha256) DO UPDATE SET path = excluded.path, "
                            "size = excluded.size, mtime = excluded.mtime",
                            "tiitttti", path, size, mtime, sha256, arch, tokenizer_hash, name, now_s());
    if (exec_stmt(s, st, "saving the model")) return -1;
    return last_id_or_lookup(s, "SELECT id FROM models WHERE sha256 = ?", "t", sha256, 0, id);
}

int store_model_id(store *s, const char *sha256, int64_t *id)
{
    sqlite3_stmt *st = prep(s, "SELECT id FROM models WHERE sha256 = ?", "t", sha256);
    if (!st) return -1;
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) *id = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return rc == SQLITE_ROW ? 0 : rc == SQLITE_DONE ? 1 : fail(s, "looking up the model");
}

int store_document_put(store *s, int64_t model_id, const char *path, const char *sha256, const char *title,
                       int64_t n_tokens, int64_t *id)
{
    sqlite3_stmt *st = prep(s,
                            "INSERT INTO documents (model_id, path, sha256, title, n_tokens, added_at) VALUES "
                            "(?, ?, ?, ?, ?, ?) ON CONFLICT (model_id, sha256) DO UPDATE SET path = excluded.path",
                            "itttii", model_id, path, sha256, title, n_tokens, now_s());
    if (exec_stmt(s, st, "saving the document")) return -1;
    return last_id_or_lookup(s, "SELECT id FROM documents WHERE model_id = ? AND sha256 = ?", "it", sha256, model_id,
                             id);
}

/* -------------------------------------------------------------------------------- sessions */

#define SESSION_COLS                                                                                                \
    "SELECT s.id, s.name, s.title, s.model_id, IFNULL(s.document_id, 0), m.path, m.sha256, IFNULL(d.path, ''), "   \
    "IFNULL(d.sha256, ''), IFNULL(d.title, ''), s.policy, IFNULL(s.budget, ''), s.created_at, s.updated_at, "       \
    "(SELECT COUNT(*) FROM messages WHERE session_id = s.id), "                                                     \
    "IFNULL((SELECT substr(text, 1, 150) FROM messages WHERE session_id = s.id ORDER BY id DESC LIMIT 1), ''), "   \
    "s.prompt_format, "                                                                                             \
    "IFNULL((SELECT SUM(IFNULL(stored, bytes)) FROM snapshots WHERE session_id = s.id), 0) + "                     \
    "IFNULL((SELECT SUM(length(c.data)) FROM chunks c WHERE c.hash IN (SELECT sc.hash FROM snapshot_chunks sc "      \
    "JOIN snapshots sn ON sn.id = sc.snapshot_id WHERE sn.session_id = s.id)), 0), "                               \
    "(SELECT COUNT(*) FROM snapshots WHERE session_id = s.id) "                                                     \
    "FROM sessions s JOIN models m ON m.id = s.model_id LEFT JOIN documents d ON d.id = s.document_id "

static void read_session(sqlite3_stmt *st, store_session *o)
{
    memset(o, 0, sizeof *o);
    o->id = sqlite3_column_int64(st, 0);
    copy_col(st, 1, o->name, sizeof o->name);
    copy_col(st, 2, o->title, sizeof o->title);
    o->model_id = sqlite3_column_int64(st, 3);
    o->document_id = sqlite3_column_int64(st, 4);
    copy_col(st, 5, o->model_path, sizeof o->model_path);
    copy_col(st, 6, o->model_sha, sizeof o->model_sha);
    copy_col(st, 7, o->doc_path, sizeof o->doc_path);
    copy_col(st, 8, o->doc_sha, sizeof o->doc_sha);
    copy_col(st, 9, o->doc_title, sizeof o->doc_title);
    copy_col(st, 10, o->policy, sizeof o->policy);
    copy_col(st, 11, o->budget, sizeof o->budget);
    o->created = sqlite3_column_int64(st, 12);
    o->updated = sqlite3_column_int64(st, 13);
    o->n_messages = sqlite3_column_int64(st, 14);
    copy_col(st, 15, o->last_message, sizeof o->last_message);
    copy_col(st, 16, o->format, sizeof o->format);
    o->snapshot_bytes = sqlite3_column_int64(st, 17);
    o->n_snapshots = sqlite3_column_int64(st, 18);
    for (char *p = o->last_message; *p; p++)
        if (*p == '\n' || *p == '\r' || *p == '\t') *p = ' ';
}

static int one_session(store *s, sqlite3_stmt *st, store_session *out)
{
    if (!st) return -1;
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) read_session(st, out);
    sqlite3_finalize(st);
    return rc == SQLITE_ROW ? 0 : rc == SQLITE_DONE ? 1 : fail(s, "reading the session");
}

int store_session_get(store *s, int64_t id, store_session *out)
{
    return one_session(s, prep(s, SESSION_COLS "WHERE s.id = ?", "i", id), out);
}

/* An id key: "#12", or all digits; *id gets the number. */
static int id_key(const char *key, int64_t *id)
{
    const char *p = key + (*key == '#');
    if (!*p) return 0;
    for (const char *c = p; *c; c++)
        if (*c < '0' || *c > '9') return 0;
    *id = strtoll(p, NULL, 10);
    return 1;
}

/* Text a session's name or title may be: not blank, at most max bytes (what store_session holds,
 * so it reads back whole). Control characters are kept: every place that shows them escapes them. */
static int label_ok(const char *what, const char *text, size_t max, char *err, size_t errlen)
{
    size_t n = strlen(text);
    const char *why = n > max ? "is too long" : strspn(text, " \t\r\n\f\v") == n ? "is blank" : NULL;
    if (!why) return 0;
    snprintf(err, errlen, "a session %s %s (%zu bytes): it is 1 to %zu bytes, not all spaces", what, why, n, max);
    return -1;
}

int store_session_name_ok(const char *name, char *err, size_t errlen)
{
    int64_t id;
    if (!*name || id_key(name, &id) || *name == '#') {
        snprintf(err, errlen, "'%.200s' cannot name a session: a name is not empty, does not start with # and is not "
                 "all digits (those are ids: #12 or 12)", name);
        return -1;
    }
    return label_ok("name", name, sizeof ((store_session *)0)->name - 1, err, errlen);
}

int store_session_title_ok(const char *title, char *err, size_t errlen)
{
    return label_ok("title", title, sizeof ((store_session *)0)->title - 1, err, errlen);
}

int store_session_latest(store *s, store_session *out)
{
    return one_session(s, prep(s, SESSION_COLS "ORDER BY s.updated_at DESC, s.id DESC LIMIT 1", NULL), out);
}

int store_session_find(store *s, const char *key, store_session *out)
{
    int64_t id;
    if (id_key(key, &id)) return store_session_get(s, id, out);
    return one_session(s, prep(s, SESSION_COLS "WHERE s.name = ?", "t", key), out);
}

int store_session_create(store *s, const char *name, const char *title, int64_t model_id, int64_t document_id,
                         const char *policy, const char *budget, const char *format, int64_t *id)
{
    if (name && *name && store_session_name_ok(name, s->err, sizeof s->err)) return -1;
    int64_t t = now_s();
    /* a session of this name made meanwhile by another kvchat process is the one to use */
    sqlite3_stmt *st = prep(s,
                            "INSERT INTO sessions (name, title, model_id, document_id, policy, budget, prompt_format, "
                            "created_at, updated_at) VALUES (?, ?, ?, NULLIF(?, 0), ?, ?, ?, ?, ?) "
                            "ON CONFLICT (name) DO NOTHING",
                            "ttiitttii", name && *name ? name : NULL, title, model_id, document_id, policy, budget, format,
                            t, t);
    if (exec_stmt(s, st, "creating the session")) return -1;
    if (sqlite3_changes(s->db) == 1) {
        *id = sqlite3_last_insert_rowid(s->db);
        return 0;
    }
    store_session ss;
    int rc = one_session(s, prep(s, SESSION_COLS "WHERE s.name = ?", "t", name), &ss);
    if (rc == 0) *id = ss.id;
    return rc == 0 ? 0 : rc < 0 ? -1 : fail(s, "creating the session");
}

int store_session_rename(store *s, int64_t id, const char *title)
{
    if (store_session_title_ok(title, s->err, sizeof s->err)) return -1;
    if (exec_stmt(s, prep(s, "UPDATE sessions SET title = ?, updated_at = ? WHERE id = ?", "tii", title, now_s(), id),
                  "renaming the session"))
        return -1;
    if (sqlite3_changes(s->db) == 0) {
        snprintf(s->err, sizeof s->err, "no session %lld", (long long)id);
        return -1;
    }
    return 0;
}

int store_session_delete(store *s, int64_t id)
{
    if (exec_sql(s, "BEGIN IMMEDIATE", "deleting the session")) return -1;
    if (exec_stmt(s, prep(s, "DELETE FROM sessions WHERE id = ?", "i", id), "deleting the session")) goto rollback;
    if (sqlite3_changes(s->db) == 0) {
        snprintf(s->err, sizeof s->err, "no session %lld", (long long)id);
        goto rollback;
    }
    /* a document no session is about any more takes its snapshots along; then the pages only this
     * session's snapshots held go too; the file keeps its size until a vacuum */
    if (exec_sql(s, "DELETE FROM document_snapshots WHERE NOT EXISTS (SELECT 1 FROM sessions ss WHERE ss.document_id "
                    "= document_snapshots.document_id)", "deleting the session") ||
        drop_orphan_chunks(s, "deleting the session") || exec_sql(s, "COMMIT", "deleting the session"))
        goto rollback;
    return 0;
rollback:
    sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
    return -1;
}

int store_session_list(store *s, void (*fn)(void *ud, const store_session *ss), void *ud)
{
    sqlite3_stmt *st = prep(s, SESSION_COLS "ORDER BY s.updated_at DESC, s.id DESC", NULL);
    if (!st) return -1;
    int rc;
    store_session ss;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        read_session(st, &ss);
        fn(ud, &ss);
    }
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : fail(s, "listing sessions");
}

/* -------------------------------------------------------------------------------- messages */

int store_message_add(store *s, int64_t session, int64_t parent, const char *role, const char *text,
                      const char *policy, const char *metrics, int64_t *id)
{
    if (exec_sql(s, "BEGIN IMMEDIATE", "saving the message")) return -1;
    sqlite3_stmt *st = prep(s,
                            "INSERT INTO messages (session_id, parent_id, role, text, policy, metrics, created_at) "
                            "VALUES (?, NULLIF(?, 0), ?, ?, ?, ?, ?)",
                            "iitttti", session, parent, role, text, policy, metrics, now_s());
    if (exec_stmt(s, st, "saving the message")) goto rollback;
    *id = sqlite3_last_insert_rowid(s->db);
    if (exec_stmt(s, prep(s, "UPDATE sessions SET updated_at = ? WHERE id = ?", "ii", now_s(), session),
                  "saving the message"))
        goto rollback;
    if (exec_sql(s, "COMMIT", "saving the message")) goto rollback;
    return 0;
rollback:
    sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
    return -1;
}

int store_latest_message(store *s, int64_t session, int64_t *id)
{
    sqlite3_stmt *st = prep(s, "SELECT IFNULL(MAX(id), 0) FROM messages WHERE session_id = ?", "i", session);
    if (!st) return -1;
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) *id = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return rc == SQLITE_ROW ? 0 : fail(s, "reading messages");
}

static int read_messages(store *s, sqlite3_stmt *st, store_message **out, int *n)
{
    *out = NULL;
    *n = 0;
    if (!st) return -1;
    int cap = 0, rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            store_message *nm = realloc(*out, sizeof *nm * (size_t)cap);
            if (!nm) {
                sqlite3_finalize(st);
                store_messages_free(*out, *n);
                *out = NULL;
                *n = 0;
                snprintf(s->err, sizeof s->err, "out of memory reading messages");
                return -1;
            }
            *out = nm;
        }
        store_message *m = &(*out)[(*n)++];
        memset(m, 0, sizeof *m);
        m->id = sqlite3_column_int64(st, 0);
        m->parent = sqlite3_column_int64(st, 1);
        copy_col(st, 2, m->role, sizeof m->role);
        const unsigned char *t = sqlite3_column_text(st, 3);
        m->text = strdup(t ? (const char *)t : "");
        copy_col(st, 4, m->policy, sizeof m->policy);
        copy_col(st, 5, m->metrics, sizeof m->metrics);
        m->created = sqlite3_column_int64(st, 6);
        if (!m->text) {
            sqlite3_finalize(st);
            store_messages_free(*out, *n);
            *out = NULL;
            *n = 0;
            snprintf(s->err, sizeof s->err, "out of memory reading messages");
            return -1;
        }
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) {
        store_messages_free(*out, *n);
        *out = NULL;
        *n = 0;
        return fail(s, "reading messages");
    }
    return 0;
}

#define MESSAGE_COLS "id, IFNULL(parent_id, 0), role, text, IFNULL(policy, ''), IFNULL(metrics, ''), created_at"

int store_message_path(store *s, int64_t id, store_message **out, int *n)
{
    return read_messages(s,
                         prep(s,
                              "WITH RECURSIVE up(mid, depth) AS (SELECT ?, 0 UNION ALL SELECT m.parent_id, up.depth + 1 "
                              "FROM messages m JOIN up ON m.id = up.mid WHERE m.parent_id IS NOT NULL) "
                              "SELECT " MESSAGE_COLS " FROM messages JOIN up ON id = up.mid ORDER BY up.depth DESC",
                              "i", id),
                         out, n);
}

int store_session_messages(store *s, int64_t session, store_message **out, int *n)
{
    return read_messages(s, prep(s, "SELECT " MESSAGE_COLS " FROM messages WHERE session_id = ? ORDER BY id", "i", session),
                         out, n);
}

void store_messages_free(store_message *m, int n)
{
    for (int i = 0; i < n; i++) free(m[i].text);
    free(m);
}

int store_search(store *s, const char *query,
                 void (*fn)(void *ud, int64_t session, int64_t message, const char *snippet), void *ud)
{
    /* the user's words as one FTS5 string literal per word: no query-syntax surprises */
    size_t L = strlen(query);
    char *q = malloc(L * 2 + 8);
    if (!q) {
        snprintf(s->err, sizeof s->err, "out of memory");
        return -1;
    }
    size_t o = 0;
    int in_word = 0;
    for (size_t i = 0; i <= L; i++) {
        char c = query[i];
        int space = c == 0 || c == ' ' || c == '\t' || c == '\n';
        if (!space && !in_word) {
            if (o) q[o++] = ' ';
            q[o++] = '"';
            in_word = 1;
        }
        if (space && in_word) {
            q[o++] = '"';
            in_word = 0;
        }
        if (!space) {
            if (c == '"') q[o++] = '"';
            q[o++] = c;
        }
    }
    q[o] = 0;
    if (o == 0) {
        free(q);
        snprintf(s->err, sizeof s->err, "search: give some words to look for");
        return -1;
    }
    sqlite3_stmt *st = prep(s,
                            "SELECT m.session_id, m.id, snippet(messages_fts, 0, '[', ']', '...', 12) FROM messages_fts "
                            "JOIN messages m ON m.id = messages_fts.rowid WHERE messages_fts MATCH ?1 "
                            "UNION ALL SELECT sessions_fts.rowid, 0, snippet(sessions_fts, 0, '[', ']', '...', 12) "
                            "FROM sessions_fts WHERE sessions_fts MATCH ?1 ORDER BY 1 DESC, 2",
                            "t", q);
    free(q);
    if (!st) return -1;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        fn(ud, sqlite3_column_int64(st, 0), sqlite3_column_int64(st, 1), (const char *)sqlite3_column_text(st, 2));
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : fail(s, "searching");
}

/* ------------------------------------------------------------------------------- snapshots */

/* Write len bytes into a zeroblob column of row rowid, in 1 MiB pieces (incremental blob I/O). */
static int write_blob(store *s, const char *table, int64_t rowid, const void *data, size_t len)
{
    sqlite3_blob *b;
    if (sqlite3_blob_open(s->db, "main", table, "data", rowid, 1, &b) != SQLITE_OK) return fail(s, "saving the snapshot");
    const char *p = data;
    for (size_t off = 0; off < len;) {
        int n = len - off > (1u << 20) ? (1 << 20) : (int)(len - off);
        if (sqlite3_blob_write(b, p + off, n, (int)off) != SQLITE_OK) {
            fail(s, "saving the snapshot");
            sqlite3_blob_close(b);
            return -1;
        }
        off += (size_t)n;
    }
    return sqlite3_blob_close(b) != SQLITE_OK ? fail(s, "saving the snapshot") : 0;
}

/* Where a kind of snapshot lives: its rows, and where each of its pages goes back. */
typedef struct snap_tables {
    const char *rows, *refs;
} snap_tables;
static const snap_tables CONV_SNAPS = { "snapshots", "snapshot_chunks" };
static const snap_tables DOC_SNAPS = { "document_snapshots", "document_snapshot_chunks" };

/* The snapshot's pages as shared chunks, the rest as its row's data. */
static int put_chunked(store *s, const snap_tables *t, int64_t id, const char *data, size_t len, const snap_range *r,
                       int64_t nr)
{
    char sql_skel[128], sql_ref[160];
    snprintf(sql_skel, sizeof sql_skel, "UPDATE %s SET data = zeroblob(?), stored = ? WHERE id = ?", t->rows);
    snprintf(sql_ref, sizeof sql_ref, "INSERT INTO %s (snapshot_id, off, bytes, hash) VALUES (?, ?, ?, ?)", t->refs);
    size_t skel = len;
    for (int64_t i = 0; i < nr; i++) skel -= r[i].len;
    char *sk = malloc(skel > 0 ? skel : 1);
    if (!sk) {
        snprintf(s->err, sizeof s->err, "saving the snapshot: out of memory");
        return -1;
    }
    size_t at = 0, o = 0;
    for (int64_t i = 0; i <= nr; i++) {
        size_t end = i < nr ? r[i].off : len;
        memcpy(sk + o, data + at, end - at);
        o += end - at;
        if (i < nr) at = r[i].off + r[i].len;
    }
    int bad = exec_stmt(s, prep(s, sql_skel, "iii", (int64_t)skel, (int64_t)skel, id), "saving the snapshot") ||
              write_blob(s, t->rows, id, sk, skel);
    free(sk);
    /* a page already stored under this hash is compared and, when its bytes differ (damaged on disk,
     * or written over by hand), replaced: a corrupt page never outlives the next snapshot that holds
     * it (INSERT OR IGNORE kept the bad bytes under the right hash, so every resume failed again) */
    sqlite3_stmt *ins = bad ? NULL : prep(s, "INSERT INTO chunks (hash, data) VALUES (?, ?) ON CONFLICT(hash) DO "
                                             "UPDATE SET data = excluded.data WHERE chunks.data IS NOT excluded.data",
                                          NULL);
    sqlite3_stmt *ref = bad ? NULL : prep(s, sql_ref, NULL);
    if (!bad && (!ins || !ref)) bad = 1;
    for (int64_t i = 0; !bad && i < nr; i++) {
        char hash[65];
        snap_sha256_bytes(data + r[i].off, r[i].len, hash);
        sqlite3_bind_text(ins, 1, hash, 64, SQLITE_STATIC);
        sqlite3_bind_blob(ins, 2, data + r[i].off, (int)r[i].len, SQLITE_STATIC);
        sqlite3_bind_int64(ref, 1, id);
        sqlite3_bind_int64(ref, 2, (sqlite3_int64)r[i].off);
        sqlite3_bind_int64(ref, 3, (sqlite3_int64)r[i].len);
        sqlite3_bind_text(ref, 4, hash, 64, SQLITE_STATIC);
        if (sqlite3_step(ins) != SQLITE_DONE || sqlite3_step(ref) != SQLITE_DONE) bad = fail(s, "saving the snapshot");
        sqlite3_reset(ins);
        sqlite3_reset(ref);
    }
    sqlite3_finalize(ins);
    sqlite3_finalize(ref);
    return bad ? -1 : 0;
}

static int enforce_limit(store *s, int64_t keep_conv, int64_t keep_doc, int64_t *removed);

/* A snapshot of kind t saved in one transaction: del (prepared: the row it replaces) and ins
 * (prepared: the new row, its data zeroblob(:blob) after every positional parameter) run, its pages go to chunks; then the oldest
 * others go while the database is over its limit, this one spared. Both statements are finalized. */
static int save_snapshot(store *s, const snap_tables *t, sqlite3_stmt *del, sqlite3_stmt *ins, const void *data,
                         size_t len, int64_t *id)
{
    snap_range *r = NULL;
    int64_t nr = 0;
    if (!del || !ins || len > 0x7fffffff) {
        if (len > 0x7fffffff)
            snprintf(s->err, sizeof s->err, "saving the snapshot: %zu bytes is more than sqlite's 2 GiB blob limit", len);
        goto fail;
    }
    int chunked = snap_page_ranges(data, len, &r, &nr) == 0 && nr > 0;
    if (sqlite3_bind_int64(ins, sqlite3_bind_parameter_index(ins, ":blob"), chunked ? 0 : (int64_t)len) != SQLITE_OK) {
        fail(s, "saving the snapshot");
        goto fail;
    }
    if (exec_sql(s, "BEGIN IMMEDIATE", "saving the snapshot")) goto fail;
    int bad = exec_stmt(s, del, "saving the snapshot");   /* exec_stmt finalizes */
    del = NULL;
    if (bad) goto rollback;
    int replaced = sqlite3_changes(s->db) > 0;
    bad = exec_stmt(s, ins, "saving the snapshot");
    ins = NULL;
    if (bad) goto rollback;
    *id = sqlite3_last_insert_rowid(s->db);
    if (chunked ? put_chunked(s, t, *id, data, len, r, nr) : write_blob(s, t->rows, *id, data, len)) goto rollback;
    if (replaced && drop_orphan_chunks(s, "saving the snapshot")) goto rollback;
    if (exec_sql(s, "COMMIT", "saving the snapshot")) goto rollback;
    free(r);
    int64_t removed;
    int is_doc = t == &DOC_SNAPS;
    if (enforce_limit(s, is_doc ? 0 : *id, is_doc ? *id : 0, &removed)) {
        char why[sizeof s->err];
        snprintf(why, sizeof why, "%s", s->err);
        snprintf(s->err, sizeof s->err, "the snapshot is saved, but pruning to the size limit failed: %.400s", why);
        return -1;
    }
    return 0;
rollback:
    sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
fail:
    sqlite3_finalize(del);
    sqlite3_finalize(ins);
    free(r);
    return -1;
}

int store_snapshot_put(store *s, int64_t session, int64_t message, const char *prefill_policy, int64_t n_tokens,
                       const void *data, size_t len, int64_t *id)
{
    return save_snapshot(s, &CONV_SNAPS,
                         prep(s, "DELETE FROM snapshots WHERE message_id = ? AND prefill_policy = ?", "it", message,
                              prefill_policy),
                         prep(s,
                              "INSERT INTO snapshots (session_id, message_id, prefill_policy, n_tokens, bytes, stored, "
                              "created_at, data) VALUES (?, ?, ?, ?, ?, ?, ?, zeroblob(:blob))",
                              "iitiiii", session, message, prefill_policy, n_tokens, (int64_t)len, (int64_t)len, now_s()),
                         data, len, id);
}

/* The row's data: the whole snapshot, or its skeleton with the pages put back at their offsets. */
static int read_snapshot(store *s, const snap_tables *t, int64_t rowid, int64_t bytes, void **data, size_t *len)
{
    char sql_refs[200];
    snprintf(sql_refs, sizeof sql_refs,
             "SELECT sc.off, sc.bytes, c.data FROM %s sc JOIN chunks c ON c.hash = sc.hash WHERE sc.snapshot_id = ? "
             "ORDER BY sc.off", t->refs);
    sqlite3_blob *b;
    if (bytes < 0 || bytes > 0x7fffffff) {
        snprintf(s->err, sizeof s->err, "the snapshot's row says %lld bytes", (long long)bytes);
        return -1;
    }
    if (sqlite3_blob_open(s->db, "main", t->rows, "data", rowid, 0, &b) != SQLITE_OK)
        return fail(s, "reading the snapshot");
    int skel = sqlite3_blob_bytes(b);
    char *p = malloc((size_t)(bytes > 0 ? bytes : 1)), *sk = malloc((size_t)(skel > 0 ? skel : 1));
    if (!p || !sk || skel > bytes) {
        sqlite3_blob_close(b);
        free(p);
        free(sk);
        if (skel > bytes) snprintf(s->err, sizeof s->err, "the snapshot is %d bytes, its row says %lld", skel, (long long)bytes);
        else snprintf(s->err, sizeof s->err, "out of memory reading the snapshot (%lld bytes)", (long long)bytes);
        return -1;
    }
    for (int off = 0; off < skel;) {
        int k = skel - off > (1 << 20) ? (1 << 20) : skel - off;
        if (sqlite3_blob_read(b, sk + off, k, off) != SQLITE_OK) {
            free(p);
            free(sk);
            fail(s, "reading the snapshot");
            sqlite3_blob_close(b);
            return -1;
        }
        off += k;
    }
    sqlite3_blob_close(b);
    sqlite3_stmt *st = prep(s, sql_refs, "i", rowid);
    int64_t at = 0, k = 0;   /* bytes of the snapshot put together, of the skeleton used */
    int rc = st ? 0 : -1, step;
    while (rc == 0 && (step = sqlite3_step(st)) == SQLITE_ROW) {
        int64_t off = sqlite3_column_int64(st, 0), n = sqlite3_column_int64(st, 1);
        const void *c = sqlite3_column_blob(st, 2);
        int cn = sqlite3_column_bytes(st, 2);
        if (off < at || n != cn || off + n > bytes || k + (off - at) > skel) {
            snprintf(s->err, sizeof s->err, "the snapshot's pages do not fit together (a page at byte %lld)", (long long)off);
            rc = -1;
            break;
        }
        memcpy(p + at, sk + k, (size_t)(off - at));
        k += off - at;
        memcpy(p + off, c, (size_t)n);
        at = off + n;
    }
    if (rc == 0 && st && step != SQLITE_DONE) rc = fail(s, "reading the snapshot");
    sqlite3_finalize(st);
    if (rc == 0 && (bytes - at != skel - k)) {
        snprintf(s->err, sizeof s->err, "the snapshot is %lld bytes, its row says %lld", (long long)(at + skel - k),
                 (long long)bytes);
        rc = -1;
    }
    if (rc == 0) memcpy(p + at, sk + k, (size_t)(bytes - at));
    free(sk);
    if (rc) {
        free(p);
        return -1;
    }
    *data = p;
    *len = (size_t)bytes;
    return 0;
}

/* The snapshot the query st (id, bytes[, message_id]) finds in table t, read whole; its row id to
 * *rowid and its message to *message where not NULL. 0, 1 when there is none, -1 (recorded). */
static int snapshot_query(store *s, const snap_tables *t, sqlite3_stmt *st, int64_t *rowid, int64_t *message,
                          void **data, size_t *len)
{
    if (!st) return -1;
    int rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        sqlite3_finalize(st);
        return rc == SQLITE_DONE ? 1 : fail(s, "reading the snapshot");
    }
    int64_t id = sqlite3_column_int64(st, 0), bytes = sqlite3_column_int64(st, 1);
    if (message) *message = sqlite3_column_int64(st, 2);
    if (rowid) *rowid = id;
    sqlite3_finalize(st);
    return read_snapshot(s, t, id, bytes, data, len);
}

int store_snapshot_get(store *s, int64_t message, const char *prefill_policy, void **data, size_t *len)
{
    return snapshot_query(s, &CONV_SNAPS,
                          prep(s, "SELECT id, bytes, message_id FROM snapshots WHERE message_id = ? AND prefill_policy = ?",
                               "it", message, prefill_policy),
                          NULL, NULL, data, len);
}

int store_snapshot_latest(store *s, int64_t session, const char *prefill_policy, int64_t *message, void **data,
                          size_t *len)
{
    return snapshot_query(s, &CONV_SNAPS,
                          prep(s,
                               "SELECT id, bytes, message_id FROM snapshots WHERE session_id = ? AND prefill_policy = ? "
                               "ORDER BY message_id DESC, id DESC LIMIT 1",
                               "it", session, prefill_policy),
                          NULL, message, data, len);
}

/* The document's row for this model (its id; 1 when the model never read that text). */
static int document_id(store *s, int64_t model_id, const char *doc_sha, int64_t *id)
{
    sqlite3_stmt *st = prep(s, "SELECT id FROM documents WHERE model_id = ? AND sha256 = ?", "it", model_id, doc_sha);
    if (!st) return -1;
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) *id = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return rc == SQLITE_ROW ? 0 : rc == SQLITE_DONE ? 1 : fail(s, "reading the documents");
}

int store_doc_snapshot_put(store *s, int64_t model_id, const char *doc_sha, const char *key, int64_t n_tokens,
                           const void *data, size_t len)
{
    int64_t doc = 0, id;
    int d = document_id(s, model_id, doc_sha, &doc);
    if (d) {
        if (d > 0) snprintf(s->err, sizeof s->err, "saving the snapshot: the document is not in the database");
        return -1;
    }
    int64_t now = now_s();
    return save_snapshot(s, &DOC_SNAPS,
                         prep(s, "DELETE FROM document_snapshots WHERE document_id = ? AND prefill_policy = ?", "it",
                              doc, key),
                         prep(s,
                              "INSERT INTO document_snapshots (document_id, prefill_policy, n_tokens, bytes, stored, "
                              "created_at, used_at, data) VALUES (?, ?, ?, ?, ?, ?, ?, zeroblob(:blob))",
                              "itiiiii", doc, key, n_tokens, (int64_t)len, (int64_t)len, now, now),
                         data, len, &id);
}

int store_doc_snapshot_get(store *s, int64_t model_id, const char *doc_sha, const char *key, void **data, size_t *len)
{
    int64_t rowid = 0;
    int rc = snapshot_query(s, &DOC_SNAPS,
                            prep(s,
                                 "SELECT ds.id, ds.bytes FROM document_snapshots ds JOIN documents d ON "
                                 "d.id = ds.document_id WHERE d.model_id = ? AND d.sha256 = ? AND ds.prefill_policy = ?",
                                 "itt", model_id, doc_sha, key),
                            &rowid, NULL, data, len);
    if (rc) return rc;
    /* when it was last used: what a size limit keeps longest (a read-only database keeps the old time) */
    sqlite3_stmt *u = prep(s, "UPDATE document_snapshots SET used_at = ? WHERE id = ?", "ii", now_s(), rowid);
    if (u) {
        sqlite3_step(u);
        sqlite3_finalize(u);
    }
    return 0;
}

int store_prune(store *s, int64_t session, int64_t *removed)
{
    /* a snapshot is kept when its message has no reply (the end of a branch, where resuming starts) */
    const char *keep = "message_id IN (SELECT m.id FROM messages m WHERE NOT EXISTS "
                       "(SELECT 1 FROM messages c WHERE c.parent_id = m.id))";
    char sql[512];
    snprintf(sql, sizeof sql, "DELETE FROM snapshots WHERE NOT (%s)%s", keep, session ? " AND session_id = ?" : "");
    if (exec_sql(s, "BEGIN IMMEDIATE", "pruning snapshots")) return -1;
    if (exec_stmt(s, session ? prep(s, sql, "i", session) : prep(s, sql, NULL), "pruning snapshots")) goto rollback;
    *removed = sqlite3_changes(s->db);
    if (drop_orphan_chunks(s, "pruning snapshots") || exec_sql(s, "COMMIT", "pruning snapshots")) goto rollback;
    return 0;
rollback:
    sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
    return -1;
}

int store_vacuum(store *s)
{
    /* with another connection open, VACUUM's copy of the database stays in the WAL beside the old
     * file (the issue: the WAL grew instead of the file shrinking): refuse while a kvchat holds a session,
     * and hand the copy to the file at once (a TRUNCATE checkpoint) */
    int64_t pid;
    int h = store_hold_other(s, 0, &pid);
    if (h < 0) return -1;
    if (h == 1) {
        snprintf(s->err, sizeof s->err, "vacuuming the database: another kvchat (pid %lld) has a session open; close "
                 "it first (a vacuum now would grow the write-ahead log instead of shrinking the file)", (long long)pid);
        return -1;
    }
    if (drop_orphan_chunks(s, "vacuuming the database") || exec_sql(s, "VACUUM", "vacuuming the database")) return -1;
    sqlite3_stmt *st = prep(s, "PRAGMA wal_checkpoint(TRUNCATE)", NULL);
    if (!st) return -1;
    int rc = sqlite3_step(st), busy = rc == SQLITE_ROW && sqlite3_column_int(st, 0) != 0;
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW) return fail(s, "vacuuming the database");
    if (busy) {
        snprintf(s->err, sizeof s->err, "vacuuming the database: another process is reading it, so the smaller copy "
                 "waits in the write-ahead log until it closes");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------ size limit */

static int meta_get(store *s, const char *key, int64_t dflt, int64_t *v)
{
    sqlite3_stmt *st = prep(s, "SELECT value FROM meta WHERE key = ?", "t", key);
    if (!st) return -1;
    int rc = sqlite3_step(st);
    *v = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : dflt;
    sqlite3_finalize(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : fail(s, "reading the database's settings");
}

static int pragma_int(store *s, const char *sql, int64_t *v)
{
    sqlite3_stmt *st = prep(s, sql, NULL);
    if (!st) return -1;
    int rc = sqlite3_step(st);
    *v = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    sqlite3_finalize(st);
    return rc == SQLITE_ROW ? 0 : fail(s, "measuring the database");
}

/* Pages in use (the free ones sqlite reuses before growing the file do not count) and the file's
 * pages, in bytes. Inside a transaction this sees the transaction's own changes. */
static int db_bytes(store *s, int64_t *used, int64_t *file)
{
    int64_t pages, free_pages, page_size;
    if (pragma_int(s, "PRAGMA page_count", &pages) || pragma_int(s, "PRAGMA freelist_count", &free_pages) ||
        pragma_int(s, "PRAGMA page_size", &page_size))
        return -1;
    *used = (pages - free_pages) * page_size;
    if (file) *file = pages * page_size;
    return 0;
}

int store_usage_get(store *s, store_usage *u)
{
    memset(u, 0, sizeof *u);
    if (db_bytes(s, &u->used, &u->file) || meta_get(s, "size_limit", STORE_DEFAULT_LIMIT, &u->limit) ||
        meta_get(s, "pruned_snapshots", 0, &u->pruned))
        return -1;
    return pragma_int(s, "SELECT COUNT(*) FROM snapshots", &u->n_snapshots);
}

int store_limit_set(store *s, int64_t bytes)
{
    if (bytes < 0) {
        snprintf(s->err, sizeof s->err, "a size limit is not negative");
        return -1;
    }
    return exec_stmt(s, prep(s, "INSERT INTO meta (key, value) VALUES ('size_limit', ?) ON CONFLICT (key) DO UPDATE "
                                "SET value = excluded.value", "i", bytes),
                     "setting the size limit");
}

int store_size_parse(const char *text, int64_t *bytes, char *err, size_t errlen)
{
    if (!strcmp(text, "off") || !strcmp(text, "none")) {
        *bytes = 0;
        return 0;
    }
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    const char *unit = end;
    double scale = 1;
    if (!strcasecmp(unit, "k") || !strcasecmp(unit, "kib") || !strcasecmp(unit, "kb")) scale = 1024.0;
    else if (!strcasecmp(unit, "m") || !strcasecmp(unit, "mib") || !strcasecmp(unit, "mb")) scale = 1024.0 * 1024;
    else if (!strcasecmp(unit, "g") || !strcasecmp(unit, "gib") || !strcasecmp(unit, "gb")) scale = 1024.0 * 1024 * 1024;
    else if (!strcasecmp(unit, "t") || !strcasecmp(unit, "tib") || !strcasecmp(unit, "tb")) scale = 1024.0 * 1024 * 1024 * 1024;
    else if (*unit && strcasecmp(unit, "b")) scale = -1;
    if (end == text || errno || scale < 0 || !(v >= 0) || v * scale > 9e18) {
        snprintf(err, errlen, "'%.100s' is not a size: give bytes or a number with K, M, G or T (1.5G, 800M), or off",
                 text);
        return -1;
    }
    *bytes = (int64_t)(v * scale);
    return 0;
}

/* While the pages in use exceed the limit, delete the oldest snapshot (a conversation's by when it
 * was saved, a document's by when it was last used; never keep_conv or keep_doc, the one just saved,
 * never a message) and the pages no other snapshot holds; *removed gets the count. Free pages are
 * reused by the next snapshot, so the file stays near the limit. */
static int enforce_limit(store *s, int64_t keep_conv, int64_t keep_doc, int64_t *removed)
{
    *removed = 0;
    int64_t limit, used;
    if (meta_get(s, "size_limit", STORE_DEFAULT_LIMIT, &limit)) return -1;
    if (limit <= 0 || db_bytes(s, &used, NULL)) return limit <= 0 ? 0 : -1;
    if (used <= limit) return 0;
    if (exec_sql(s, "BEGIN IMMEDIATE", "keeping the database under its size limit")) return -1;
    /* the oldest snapshot first (ids grow with each save); the messages stay, so a session whose
     * snapshots went is resumed by prefilling its conversation again */
    for (;;) {
        /* a document snapshot counts by when it was last used (opening its text again refreshes it),
         * a conversation's by when it was saved; in the same second, in the order they were saved */
        sqlite3_stmt *st = prep(s,
                                "SELECT kind, id FROM (SELECT 0 AS kind, id, created_at AS t FROM snapshots WHERE id != ? "
                                "UNION ALL SELECT 1, id, used_at FROM document_snapshots WHERE id != ?) "
                                "ORDER BY t, kind, id LIMIT 1",
                                "ii", keep_conv, keep_doc);
        if (!st) goto rollback;
        int rc = sqlite3_step(st);
        int kind = rc == SQLITE_ROW ? sqlite3_column_int(st, 0) : 0;
        int64_t id = rc == SQLITE_ROW ? sqlite3_column_int64(st, 1) : 0;
        sqlite3_finalize(st);
        if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
            fail(s, "keeping the database under its size limit");
            goto rollback;
        }
        if (!id) break;   /* only the snapshot just saved is left: it stays, over the limit */
        if (exec_stmt(s, prep(s, kind ? "DELETE FROM document_snapshots WHERE id = ?" : "DELETE FROM snapshots WHERE id = ?",
                              "i", id),
                      "pruning a snapshot") ||
            drop_orphan_chunks(s, "pruning a snapshot"))
            goto rollback;
        (*removed)++;
        if (db_bytes(s, &used, NULL)) goto rollback;
        if (used <= limit) break;
    }
    if (exec_stmt(s, prep(s, "INSERT INTO meta (key, value) VALUES ('pruned_snapshots', ?) ON CONFLICT (key) DO "
                             "UPDATE SET value = value + excluded.value", "i", *removed),
                  "keeping the database under its size limit") ||
        exec_sql(s, "COMMIT", "keeping the database under its size limit"))
        goto rollback;
    return 0;
rollback:
    sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
    *removed = 0;
    return -1;
}

/* ----------------------------------------------------------------------------------- holds */

/* A process's start time (clock ticks since boot, /proc/PID/stat's 22nd field): with the pid it
 * names one process, so a pid the system gave to another process since does not count as holding.
 * 0 where /proc cannot say. */
static int64_t process_start(long pid)
{
    char path[64], buf[1024], err[200];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = files_open_read(path, 1 << 16, "a process's status", err, sizeof err);
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');   /* the command name may hold spaces and parentheses */
    if (!p) return 0;
    p++;
    for (int field = 3; field < 22 && p; field++) p = strchr(p + 1, ' ');
    return p ? strtoll(p + 1, NULL, 10) : 0;
}

static int process_alive(long pid, int64_t started)
{
    if (kill((pid_t)pid, 0) != 0 && errno != EPERM) return 0;
    int64_t now = process_start(pid);
    return !started || !now || now == started;
}

int store_hold(store *s, int64_t session)
{
    /* a read-only database cannot take a hold, and cannot be forked either: nothing is saved */
    if (s->held == session || sqlite3_db_readonly(s->db, "main") == 1) return 0;
    long pid = (long)getpid();
    if (s->held && exec_stmt(s, prep(s, "DELETE FROM holds WHERE session_id = ? AND pid = ?", "ii", s->held,
                                     (int64_t)pid),
                             "letting go of the session"))
        return -1;
    s->held = 0;
    if (!session) return 0;
    if (exec_stmt(s, prep(s, "INSERT OR REPLACE INTO holds (session_id, pid, started, created_at) VALUES (?, ?, ?, ?)",
                          "iiii", session, (int64_t)pid, process_start(pid), now_s()),
                  "holding the session"))
        return -1;
    s->held = session;
    return 0;
}

int store_hold_other(store *s, int64_t session, int64_t *pid)
{
    char sql[200];
    snprintf(sql, sizeof sql, "SELECT pid, started FROM holds WHERE pid != ?%s", session ? " AND session_id = ?" : "");
    sqlite3_stmt *st = session ? prep(s, sql, "ii", (int64_t)getpid(), session) : prep(s, sql, "i", (int64_t)getpid());
    if (!st) return -1;
    int rc, found = 0;
    while (!found && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        int64_t p = sqlite3_column_int64(st, 0), started = sqlite3_column_int64(st, 1);
        if (process_alive((long)p, started)) {   /* a dead holder's row is stale: ignored */
            *pid = p;
            found = 1;
        }
    }
    sqlite3_finalize(st);
    if (found) return 1;
    return rc == SQLITE_DONE ? 0 : fail(s, "reading the holds");
}

/* ------------------------------------------------------------------------ thresholds, events */

int store_thresholds_put(store *s, int64_t model_id, const unc_thresholds *t)
{
    char *hs = malloc((size_t)t->n_heads * 40 + 1);
    if (!hs) {
        snprintf(s->err, sizeof s->err, "out of memory");
        return -1;
    }
    size_t o = 0;
    hs[0] = 0;
    for (int i = 0; i < t->n_heads; i++)
        o += (size_t)sprintf(hs + o, "%s%d:%d:%.6f", i ? " " : "", t->head_sim[i].layer, t->head_sim[i].head,
                             t->head_sim[i].sim);
    sqlite3_stmt *st = prep(s,
                            "INSERT OR REPLACE INTO thresholds (model_id, entropy_mean, entropy_var, quantile, page, "
                            "samples, seed, head_similarity, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            "idddiiiti", model_id, t->h_mean, t->h_var, t->quantile, (int64_t)t->page, t->samples,
                            (int64_t)t->seed, hs, now_s());
    free(hs);
    return exec_stmt(s, st, "saving the thresholds");
}

int store_thresholds_get(store *s, int64_t model_id, unc_thresholds *t)
{
    sqlite3_stmt *st = prep(s,
                            "SELECT entropy_mean, entropy_var, IFNULL(quantile, 0), IFNULL(page, 0), IFNULL(samples, 0), "
                            "IFNULL(seed, 0), IFNULL(head_similarity, '') FROM thresholds WHERE model_id = ?",
                            "i", model_id);
    if (!st) return -1;
    int rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        sqlite3_finalize(st);
        return rc == SQLITE_DONE ? 1 : fail(s, "reading the thresholds");
    }
    memset(t, 0, sizeof *t);
    t->valid = 1;
    t->h_mean = sqlite3_column_double(st, 0);
    t->h_var = sqlite3_column_double(st, 1);
    t->quantile = sqlite3_column_double(st, 2);
    t->page = sqlite3_column_int(st, 3);
    t->samples = sqlite3_column_int64(st, 4);
    t->seed = (uint64_t)sqlite3_column_int64(st, 5);
    const char *p = (const char *)sqlite3_column_text(st, 6);
    while (p && *p && t->n_heads < UNC_MAX_HEADS) {
        int la, hd, used = 0;
        float sim;
        if (sscanf(p, "%d:%d:%f%n", &la, &hd, &sim, &used) != 3) break;
        t->head_sim[t->n_heads++] = (unc_head_sim){ (int16_t)la, (int16_t)hd, sim };
        p += used;
        while (*p == ' ') p++;
    }
    snprintf(t->source, sizeof t->source, "the database");
    sqlite3_finalize(st);
    return 0;
}

static void page_list(char *buf, size_t cap, const int *p, int n)
{
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < n && i < UNC_EVENT_PAGES && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%d", i ? "," : "", p[i]);
}

int store_events_put(store *s, int64_t message, const unc_event *e, int n)
{
    if (n == 0) return 0;
    if (exec_sql(s, "BEGIN IMMEDIATE", "saving the events")) return -1;
    for (int i = 0; i < n; i++) {
        char add[200], rem[200];
        page_list(add, sizeof add, e[i].added, e[i].n_added);
        page_list(rem, sizeof rem, e[i].removed, e[i].n_removed);
        sqlite3_stmt *st = prep(s,
                                "INSERT INTO events (message_id, step, pos, page, mean_h, var_h, thr_h, thr_v, "
                                "pages_added, pages_removed, regenerated, recovered, after_mean_h, after_var_h) VALUES "
                                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                "iiiiddddttiidd", message, e[i].step, e[i].pos, e[i].page, e[i].stats.mean_h,
                                e[i].stats.var_h, e[i].thr_h, e[i].thr_v, add, rem, (int64_t)e[i].regenerated,
                                (int64_t)e[i].recovered, e[i].after.mean_h, e[i].after.var_h);
        if (exec_stmt(s, st, "saving the events")) {
            sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
            return -1;
        }
    }
    if (exec_sql(s, "COMMIT", "saving the events")) {
        sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
        return -1;
    }
    return 0;
}

int store_event_count(store *s, int64_t message, int64_t *n)
{
    sqlite3_stmt *st = prep(s, "SELECT COUNT(*) FROM events WHERE message_id = ?", "i", message);
    if (!st) return -1;
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) *n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return rc == SQLITE_ROW ? 0 : fail(s, "counting events");
}
