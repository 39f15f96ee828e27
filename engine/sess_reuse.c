/* sess_reuse.c - not reading text twice (see sess_reuse.h): document snapshots filed by content,
 * and a conversation rebuilt from the longest stored state that its sequence begins with. */
#include "engine/sess_reuse.h"

#include <stdlib.h>
#include <string.h>

void sess_doc_snapshot_key(const session *s, char *buf, size_t cap)
{
    char key[256];
    sess_current_prefill_key(s, key, sizeof key);
    snprintf(buf, cap, "%.200s|%s", key, s->chat ? "chat" : "plain");
}

void sess_save_doc_snapshot(session *s)
{
    if (!s->have_db || !s->db.put_doc_snapshot || !s->sid) return;
    char key[256], e[1024];
    void *data;
    size_t len;
    sess_doc_snapshot_key(s, key, sizeof key);
    if (run_snapshot(s->r, s->msha, &data, &len, e, sizeof e) == 0) {
        int bad = s->db.put_doc_snapshot(s->db.ud, s->doc_sha, key, sess_seq_len(s), data, len, e, sizeof e);
        free(data);
        if (!bad) return;
    }
    sess_note(s, "the document's snapshot could not be saved (%.900s): opening it again will read it again", e);
}

/* The run holds a prefix of want (its ids) with at most pos of them in the cache. */
static int holds_prefix(const session *s, const int32_t *want, int64_t n_want, int64_t pos)
{
    int64_t n;
    const int32_t *have = run_tokens(s->r, &n);
    return n <= n_want && run_pos(s->r) <= pos && (n <= pos || n == n_want) &&
           !memcmp(have, want, sizeof(int32_t) * (size_t)n);
}

int sess_restore_doc_snapshot(session *s, const int32_t *ids, int64_t n, double *ms)
{
    if (!s->have_db || !s->db.get_doc_snapshot) return 1;
    char key[256], e[1024];
    void *data = NULL;
    size_t len = 0;
    sess_doc_snapshot_key(s, key, sizeof key);
    double t0 = run_clock_s();
    int g = s->db.get_doc_snapshot(s->db.ud, s->doc_sha, key, &data, &len, e, sizeof e);
    if (g < 0) sess_note(s, "the document's snapshot cannot be read (%.900s): reading the document", e);
    if (g) return 1;
    int ok = run_restore(s->r, data, len, s->msha, e, sizeof e) == 0;
    free(data);
    if (ok && holds_prefix(s, ids, n, n) && run_pos(s->r) == n) {
        run_place(s->r);   /* kept: on a GPU, the cache goes there now */
        *ms = (run_clock_s() - t0) * 1e3;
        return 0;
    }
    /* another context or page size, or tokens that differ: read the document instead */
    if (ok) sess_note(s, "the document's snapshot under %s is not this document as it is read now: reading it", key);
    else sess_note(s, "the document's snapshot under %s is not usable (%.900s): reading the document", key, e);
    run_rewind(s->r, 0, 0, e, sizeof e);
    return 1;
}

/* The rest of want after what the run holds: evaluated up to pos, appended after it. */
static int read_the_rest(session *s, const int32_t *want, int64_t n_want, int64_t pos)
{
    int64_t n;
    run_tokens(s->r, &n);
    int64_t upto = pos > n ? pos : n;
    if (upto > n && run_append(s->r, want + n, upto - n, s->err, sizeof s->err)) return SESS_EFAIL;
    if (run_pos(s->r) < pos) {
        int rc = run_feed(s->r, NULL, 0, NULL, NULL, s->err, sizeof s->err);
        if (rc) return rc;
    }
    if (n_want > upto && run_append(s->r, want + upto, n_want - upto, s->err, sizeof s->err)) return SESS_EFAIL;
    return SESS_OK;
}

int sess_rebuild_from_stored(session *s, int64_t leaf, const int32_t *want, int64_t n_want, int64_t pos,
                             sess_rebuilt *rb)
{
    char key[256], e[1024];
    memset(rb, 0, sizeof *rb);
    if (!s->have_db) return 1;
    sess_current_prefill_key(s, key, sizeof key);
    sess_message *path = NULL;
    int n_path = 0, rc = 1;
    if (leaf && s->db.path(s->db.ud, leaf, &path, &n_path, e, sizeof e)) n_path = 0;
    /* the answers on the path, newest first (leaf's own first): each one's snapshot is a state the
     * sequence began with */
    for (int j = n_path - 1; j >= 0 && rc == 1; j--) {
        if (strcmp(path[j].role, "assistant") != 0) continue;
        void *data = NULL;
        size_t len = 0;
        int g = s->db.get_snapshot(s->db.ud, path[j].id, key, &data, &len, e, sizeof e);
        if (g < 0) sess_note(s, "the snapshot after answer %d under %s cannot be read (%.600s)", (j + 1) / 2, key, e);
        if (g) continue;
        int bad = run_restore(s->r, data, len, s->msha, e, sizeof e);
        free(data);
        if (bad) sess_note(s, "the snapshot after answer %d under %s is not usable (%.600s)", (j + 1) / 2, key, e);
        if (bad || !holds_prefix(s, want, n_want, pos)) continue;
        run_place(s->r);
        rb->answer = (j + 1) / 2;
        rb->bytes = len;
        rb->at_leaf = path[j].id == leaf;
        rc = 0;
    }
    sess_messages_free(path, n_path);
    double ms;
    if (rc == 1 && s->doc_tokens > 0 && s->doc_tokens <= n_want &&
        sess_restore_doc_snapshot(s, want, s->doc_tokens, &ms) == 0)
        rc = 0;
    if (rc == 1) {
        run_rewind(s->r, 0, 0, e, sizeof e);
        return 1;
    }
    run_tokens(s->r, &rb->from);
    rc = read_the_rest(s, want, n_want, pos);
    if (rc) run_rewind(s->r, 0, 0, e, sizeof e);
    return rc;
}
