/* store.h - kvchat's sqlite database: models, documents, sessions, messages (a tree: each message
 * knows its parent, so an edited question branches and both branches persist), KV snapshots,
 * calibration thresholds and uncertainty events, with full-text search over messages and session
 * titles; a size limit that prunes the oldest snapshots, and holds on the sessions a kvchat has open.
 * docs/store.md documents the schema.
 *
 * One database file (WAL mode, foreign keys on, busy timeout so two kvchat processes wait for each
 * other instead of failing), schema versioned with PRAGMA user_version and migrated in a
 * transaction. Every statement is prepared with bound parameters. Every function returns 0 on
 * success and -1 with a one-line message in the store's error buffer (store_error). */
#ifndef KVCHAT_STORE_H
#define KVCHAT_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/uncertainty.h"

typedef struct store store;

#define STORE_SCHEMA_VERSION 3

/* kvchat's data directory: $XDG_DATA_HOME/kvchat, else ~/.local/share/kvchat (created when asked).
 * 0, or -1 when neither variable is set or it cannot be created. */
int store_data_dir(char *buf, size_t cap, int create);
/* The default database, kvchat.db in the data directory (created when asked). */
int store_default_path(char *buf, size_t cap, int create);
/* Open (creating and migrating) the database at path (a file name or an sqlite URI such as
 * file:/x/kvchat.db?mode=ro). NULL with a message in err on failure. */
store *store_open(const char *path, char *err, size_t errlen);
void store_close(store *s);
const char *store_error(const store *s);

/* Models: one row per distinct file content (sha256). The sha256 of a file already seen at the same
 * path, size and modification time is taken from the table instead of hashing again. */
int store_model_cached_sha(store *s, const char *path, int64_t size, int64_t mtime, char sha[65]);
int store_model_put(store *s, const char *path, int64_t size, int64_t mtime, const char *sha256, const char *arch,
                    const char *tokenizer_hash, const char *name, int64_t *id);

/* The id of the model with that sha256; 1 when it is not known. */
int store_model_id(store *s, const char *sha256, int64_t *id);

int store_document_put(store *s, int64_t model_id, const char *path, const char *sha256, const char *title,
                       int64_t n_tokens, int64_t *id);

typedef struct store_session {
    int64_t id;
    char name[128];            /* unique, as given with --session (may be empty) */
    char title[256];
    int64_t model_id, document_id;
    char model_path[1024], model_sha[65];
    char doc_path[1024], doc_sha[65], doc_title[256];
    char policy[256], budget[32];
    int64_t created, updated;  /* unix seconds */
    int64_t n_messages;
    char last_message[160];    /* the start of the newest message */
    char format[16];           /* how turns are written: "chat" (the model's template) or "plain" */
    int64_t snapshot_bytes;    /* what its snapshots take in the file (a page shared with another
                                  session's snapshot counts for both) */
    int64_t n_snapshots;
} store_session;

/* The most recently updated session (what store_session_list gives first); 1 when there is none. */
int store_session_latest(store *s, store_session *out);
/* Find by id ("#12", or all digits) or by name. 1 when there is none. */
int store_session_find(store *s, const char *key, store_session *out);
/* 0 when name can name a session (not empty, not all digits, not starting with '#': those are ids),
 * else -1 with a message. */
int store_session_name_ok(const char *name, char *err, size_t errlen);
/* 0 when title can be a session's title (1 to 255 bytes, not blank; a name is held to the same, at
 * most 127 bytes), else -1 with a message. */
int store_session_title_ok(const char *title, char *err, size_t errlen);
int store_session_get(store *s, int64_t id, store_session *out);
/* A new session; with a name another process created meanwhile, that session (*id names it). */
int store_session_create(store *s, const char *name, const char *title, int64_t model_id, int64_t document_id,
                         const char *policy, const char *budget, const char *format, int64_t *id);
int store_session_rename(store *s, int64_t id, const char *title);
int store_session_delete(store *s, int64_t id);
int store_session_list(store *s, void (*fn)(void *ud, const store_session *ss), void *ud);

typedef struct store_message {
    int64_t id, parent;        /* parent 0: a root */
    char role[16];
    char *text;                /* malloc'd */
    char policy[256];
    char metrics[512];
    int64_t created;
} store_message;

int store_message_add(store *s, int64_t session, int64_t parent, const char *role, const char *text,
                      const char *policy, const char *metrics, int64_t *id);
/* The newest message of the session (the leaf a resumed conversation continues from); 0 if none. */
int store_latest_message(store *s, int64_t session, int64_t *id);
/* The messages from the root down to message id, in order (free with store_messages_free). */
int store_message_path(store *s, int64_t id, store_message **out, int *n);
/* Every message of the session in creation order (all branches). */
int store_session_messages(store *s, int64_t session, store_message **out, int *n);
void store_messages_free(store_message *m, int n);

/* Full-text search over messages and session titles: fn gets each hit (message 0: a title). */
int store_search(store *s, const char *query,
                 void (*fn)(void *ud, int64_t session, int64_t message, const char *snippet), void *ud);

/* Snapshots: written in one transaction, so a crash leaves the previous snapshot intact. The cache's
 * pages (engine/snapshot.h: snap_page_ranges) are stored once by content (sha256) and shared by every
 * snapshot that holds them (a conversation's consecutive snapshots share most pages); the rest is
 * the snapshot's row. Reading puts the bytes back together; the snapshot's own checksum then
 * verifies the whole. One per (message, prefill policy): a newer one replaces the older. After the
 * save, while the pages in use exceed the size limit, the oldest other snapshots (conversations' by
 * when they were saved, documents' by when they were last used) go with the pages no other snapshot
 * holds; never a message (store_doc_snapshot_put does the same). */
int store_snapshot_put(store *s, int64_t session, int64_t message, const char *prefill_policy, int64_t n_tokens,
                       const void *data, size_t len, int64_t *id);
/* The snapshot taken after message for that prefill policy; 1 when there is none. data is malloc'd. */
int store_snapshot_get(store *s, int64_t message, const char *prefill_policy, void **data, size_t *len);
/* A document's cache right after it was read (documents: one per model and text), under key (the
 * prefill policy and prompt form): shared by every conversation about the same text. put needs the
 * document's row (a conversation about it was stored); get: 1 when there is none. */
int store_doc_snapshot_put(store *s, int64_t model_id, const char *doc_sha, const char *key, int64_t n_tokens,
                           const void *data, size_t len);
int store_doc_snapshot_get(store *s, int64_t model_id, const char *doc_sha, const char *key, void **data, size_t *len);
/* The newest snapshot of the session for that prefill policy (its message in *message). */
int store_snapshot_latest(store *s, int64_t session, const char *prefill_policy, int64_t *message, void **data,
                          size_t *len);

/* Delete the snapshots that are not at the end of a branch (of one session, or 0: of all), and the
 * pages nothing refers to any more; *removed gets the count. */
int store_prune(store *s, int64_t session, int64_t *removed);
/* Drop pages nothing refers to and rebuild the file at its smallest (VACUUM), then checkpoint the
 * write-ahead log into the file and empty it. Refused while another live kvchat holds a session (the
 * copy would wait in the log); an error too when another reader kept the checkpoint from finishing. */
int store_vacuum(store *s);

/* The size limit. The database holds it (table meta), so every front end keeps the same one; 1 GiB
 * unless set: about 30 to 200 snapshots of the default model (5 to 34 MiB each, less where pages are
 * shared), far more than the conversations a resume uses, yet small beside any disk it runs on. */
#define STORE_DEFAULT_LIMIT (1LL << 30)

typedef struct store_usage {
    int64_t used;            /* bytes of pages in use ((page_count - freelist_count) * page_size) */
    int64_t file;            /* bytes of the main file's pages (the free ones are reused before it grows) */
    int64_t limit;           /* 0: no limit */
    int64_t pruned;          /* snapshots the limit has deleted, ever */
    int64_t n_snapshots;
} store_usage;

int store_usage_get(store *s, store_usage *u);
/* Set the limit in bytes (0: none); it applies from the next snapshot saved. */
int store_limit_set(store *s, int64_t bytes);
/* "1G", "800M", "1.5GiB", "1048576", "off": 0, or -1 with a message. */
int store_size_parse(const char *text, int64_t *bytes, char *err, size_t errlen);

/* Holds: a kvchat with a session open (the terminal interface) holds it: a row with its pid and
 * process start time, removed when it lets go or closes the store. A hold whose process is gone
 * (or whose pid now names another process) is ignored. store_hold(s, 0) lets go. */
int store_hold(store *s, int64_t session);
/* 1 with *pid when another live process holds session (0: any session), 0 when none does. */
int store_hold_other(store *s, int64_t session, int64_t *pid);

int store_thresholds_put(store *s, int64_t model_id, const unc_thresholds *t);
int store_thresholds_get(store *s, int64_t model_id, unc_thresholds *t);   /* 1: none */
int store_events_put(store *s, int64_t message, const unc_event *e, int n);
int store_event_count(store *s, int64_t message, int64_t *n);

/* PRAGMA integrity_check: 0 when the database is consistent. */
int store_check(store *s);

#endif
