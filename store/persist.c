/* persist.c - sess_persist over the sqlite store (see persist.h). */
#include "store/persist.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/text.h"
#include "engine/snapshot.h"
#include "engine/tokenizer.h"

static int db_fail(store_persist *p, char *err, size_t errlen)
{
    snprintf(err, errlen, "%s", store_error(p->db));
    return -1;
}

/* sha256 over every vocabulary piece: two files with the same tokenizer share it */
static void tokenizer_hash(const model *m, char out[65])
{
    int32_t n = tok_n_vocab(m->vocab);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (int32_t i = 0; buf && i < n; i++) {
        const char *piece = tok_piece(m->vocab, i);
        size_t k = piece ? strlen(piece) + 1 : 1;
        if (len + k > cap) {
            char *nb = realloc(buf, cap * 2 + k);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap = cap * 2 + k;
        }
        memcpy(buf + len, piece ? piece : "", k);
        len += k;
    }
    snap_sha256_bytes(buf ? buf : "", buf ? len : 0, out);
    free(buf);
}

/* The model's row; its sha256 is taken from the table when the file's path, size and modification
 * time are already known, else computed. */
static int p_model(void *ud, const char *path, const model *m, char sha[65], char *err, size_t errlen)
{
    store_persist *p = ud;
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, errlen, "cannot stat %s: %s", path, strerror(errno));
        return -1;
    }
    int rc = store_model_cached_sha(p->db, path, (int64_t)st.st_size, (int64_t)st.st_mtime, sha);
    if (rc < 0) return db_fail(p, err, errlen);
    if (rc == 1 && snap_sha256_file(path, sha, err, errlen)) return -1;
    char tk[65];
    tokenizer_hash(m, tk);
    if (store_model_put(p->db, path, (int64_t)st.st_size, (int64_t)st.st_mtime, sha, m->arch_name, tk, m->name,
                        &p->model_id))
        return db_fail(p, err, errlen);
    return 0;
}

static int p_find(void *ud, const char *key, sess_stored *out, char *err, size_t errlen)
{
    store_persist *p = ud;
    store_session ss;
    memset(&ss, 0, sizeof ss);
    int f = *key ? store_session_find(p->db, key, &ss) : store_session_latest(p->db, &ss);
    if (f < 0) return db_fail(p, err, errlen);
    if (f == 1) return 1;
    /* continuing a conversation another kvchat has open would fork it unseen (two answers to one
     * question, each its own branch): refused until that one closes it */
    int64_t pid;
    int h = store_hold_other(p->db, ss.id, &pid);
    if (h < 0) return db_fail(p, err, errlen);
    if (h == 1) {
        snprintf(err, errlen, "session %lld%s%.128s%s is open in another kvchat (pid %lld): close it there first, or "
                 "start another session", (long long)ss.id, ss.name[0] ? " (" : "", ss.name, ss.name[0] ? ")" : "",
                 (long long)pid);
        return -1;
    }
    if (p->hold && store_hold(p->db, ss.id)) return db_fail(p, err, errlen);
    memset(out, 0, sizeof *out);
    out->id = ss.id;
    snprintf(out->name, sizeof out->name, "%s", ss.name);
    snprintf(out->title, sizeof out->title, "%s", ss.title);
    snprintf(out->model_sha, sizeof out->model_sha, "%s", ss.model_sha);
    snprintf(out->model_path, sizeof out->model_path, "%s", ss.model_path);
    snprintf(out->doc_path, sizeof out->doc_path, "%s", ss.doc_path);
    snprintf(out->doc_sha, sizeof out->doc_sha, "%s", ss.doc_sha);
    snprintf(out->doc_title, sizeof out->doc_title, "%s", ss.doc_title);
    snprintf(out->policy, sizeof out->policy, "%s", ss.policy);
    snprintf(out->budget, sizeof out->budget, "%s", ss.budget);
    snprintf(out->format, sizeof out->format, "%s", ss.format);
    return 0;
}

static int p_create(void *ud, const sess_stored *s, int64_t doc_tokens, int64_t *id, char *err, size_t errlen)
{
    store_persist *p = ud;
    /* the same document opened again while the newest session about it has no question yet: that
     * one goes on, rather than a second empty session beside it */
    store_session last;
    memset(&last, 0, sizeof last);
    if (!s->name[0] && store_session_latest(p->db, &last) == 0 && !last.n_messages &&
        !last.name[0] && last.model_id == p->model_id && !strcmp(last.doc_sha, s->doc_sha) &&
        !strcmp(last.policy, s->policy) && !strcmp(last.budget, s->budget) && !strcmp(last.format, s->format)) {
        *id = last.id;
        return p->hold && store_hold(p->db, *id) ? db_fail(p, err, errlen) : 0;
    }
    int64_t doc_id;
    if (store_document_put(p->db, p->model_id, s->doc_path, s->doc_sha, s->doc_title, doc_tokens, &doc_id) ||
        store_session_create(p->db, s->name[0] ? s->name : NULL, s->title, p->model_id, doc_id, s->policy, s->budget,
                             s->format, id))
        return db_fail(p, err, errlen);
    /* a named session another process made meanwhile must be about the same document and model */
    store_session got;
    if (s->name[0] && store_session_get(p->db, *id, &got) == 0 &&
        (strcmp(got.doc_sha, s->doc_sha) != 0 || got.model_id != p->model_id)) {
        snprintf(err, errlen, "a session named '%s' about %s exists already", s->name,
                 strcmp(got.doc_sha, s->doc_sha) ? "another document" : "another model's conversation");
        return -1;
    }
    if (p->hold && store_hold(p->db, *id)) return db_fail(p, err, errlen);
    return 0;
}

static int p_latest(void *ud, int64_t sid, int64_t *message, char *err, size_t errlen)
{
    store_persist *p = ud;
    return store_latest_message(p->db, sid, message) ? db_fail(p, err, errlen) : 0;
}

static int p_path(void *ud, int64_t message, sess_message **out, int *n, char *err, size_t errlen)
{
    store_persist *p = ud;
    store_message *m = NULL;
    int k = 0;
    if (store_message_path(p->db, message, &m, &k)) return db_fail(p, err, errlen);
    sess_message *r = calloc((size_t)(k > 0 ? k : 1), sizeof *r);
    if (!r) {
        store_messages_free(m, k);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int i = 0; i < k; i++) {
        r[i].id = m[i].id;
        r[i].parent = m[i].parent;
        snprintf(r[i].role, sizeof r[i].role, "%s", m[i].role);
        snprintf(r[i].policy, sizeof r[i].policy, "%s", m[i].policy);
        r[i].text = m[i].text;   /* the text moves */
        m[i].text = NULL;
    }
    store_messages_free(m, k);
    *out = r;
    *n = k;
    return 0;
}

static int p_add_message(void *ud, int64_t sid, int64_t parent, const char *role, const char *text,
                         const char *policy, const char *metrics, int64_t *id, char *err, size_t errlen)
{
    store_persist *p = ud;
    return store_message_add(p->db, sid, parent, role, text, policy, metrics, id) ? db_fail(p, err, errlen) : 0;
}

static int p_add_events(void *ud, int64_t message, const unc_event *e, int n, char *err, size_t errlen)
{
    store_persist *p = ud;
    return store_events_put(p->db, message, e, n) ? db_fail(p, err, errlen) : 0;
}

static int p_get_snapshot(void *ud, int64_t message, const char *key, void **data, size_t *len, char *err,
                          size_t errlen)
{
    store_persist *p = ud;
    int g = store_snapshot_get(p->db, message, key, data, len);
    return g < 0 ? db_fail(p, err, errlen) : g;
}

static int p_put_snapshot(void *ud, int64_t sid, int64_t message, const char *key, int64_t n_tokens,
                          const void *data, size_t len, char *err, size_t errlen)
{
    store_persist *p = ud;
    int64_t id;
    return store_snapshot_put(p->db, sid, message, key, n_tokens, data, len, &id) ? db_fail(p, err, errlen) : 0;
}

static int p_get_doc_snapshot(void *ud, const char *doc_sha, const char *key, void **data, size_t *len, char *err,
                              size_t errlen)
{
    store_persist *p = ud;
    int g = store_doc_snapshot_get(p->db, p->model_id, doc_sha, key, data, len);
    return g < 0 ? db_fail(p, err, errlen) : g;
}

static int p_put_doc_snapshot(void *ud, const char *doc_sha, const char *key, int64_t n_tokens, const void *data,
                              size_t len, char *err, size_t errlen)
{
    store_persist *p = ud;
    return store_doc_snapshot_put(p->db, p->model_id, doc_sha, key, n_tokens, data, len) ? db_fail(p, err, errlen) : 0;
}

void store_persist_init(store_persist *p, store *db)
{
    memset(p, 0, sizeof *p);
    p->db = db;
    p->ops = (sess_persist){ p, p_model, p_find, p_create, p_latest, p_path, p_add_message, p_add_events,
                             p_get_snapshot, p_put_snapshot, p_get_doc_snapshot, p_put_doc_snapshot };
}

static const char *base_name(const char *s)
{
    const char *b = strrchr(s, '/');
    return b ? b + 1 : s;
}

int store_export_md(store *db, const store_session *ss, FILE *f, char *err, size_t errlen)
{
    int64_t leaf;
    store_message *m = NULL;
    int n = 0;
    if (store_latest_message(db, ss->id, &leaf) || (leaf && store_message_path(db, leaf, &m, &n))) {
        snprintf(err, errlen, "%s", store_error(db));
        return -1;
    }
    /* control characters escaped: the file is read in terminals too */
    fputs("# ", f);
    text_put(f, ss->title, 0);
    fputs("\n\n- model: `", f);
    text_put(f, base_name(ss->model_path), 0);
    fputs("`\n- document: ", f);
    text_put(f, ss->doc_title, 0);
    fputs(" (`", f);
    text_put(f, ss->doc_path, 0);
    fputs("`)\n- policy: `", f);
    text_put(f, ss->policy, 0);
    fputs("`", f);
    if (ss->budget[0]) {
        fputs(", budget `", f);
        text_put(f, ss->budget, 0);
        fputs("`", f);
    }
    fputs("\n\n", f);
    for (int i = 0; i < n; i++) {
        fprintf(f, "## %s\n\n", !strcmp(m[i].role, "user") ? "Question" : "Answer");
        text_put(f, m[i].text, TEXT_KEEP_NEWLINE | TEXT_KEEP_TAB);
        fputs("\n\n", f);
    }
    store_messages_free(m, n);
    if (fflush(f) || ferror(f)) {
        snprintf(err, errlen, "writing the export failed: %s", strerror(errno));
        return -1;
    }
    return 0;
}
