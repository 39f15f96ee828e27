/* sess_resume.c - continuing a stored conversation (sess_resume in session.h): its messages to the
 * front end, its cache from the snapshot after the last answer under the current prefill policy,
 * else from an older snapshot and the turns after it, else the document and the conversation
 * prefilled again (now, or with the next question). */
#include <stdlib.h>
#include <string.h>

#include "engine/prompt.h"
#include "engine/sess_doc.h"
#include "engine/sess_reuse.h"
#include "engine/sess_store.h"
#include "engine/snapshot.h"
#include "engine/tokenizer.h"

/* Prefill the conversation along path (texts; the last two are the last question and its answer)
 * after doc, now. */
static int replay_conversation(session *s, const char *doc, const sess_message *path, int n_path)
{
    const model *m = run_model(s->r);
    size_t nn = 0, na = 0;
    int32_t *all = NULL, *ans = NULL;
    if (n_path < 2) {
        if (prompt_document(m, sess_gemma_turns(s), doc, &all, &nn, s->err, sizeof s->err)) return SESS_EFAIL;
    } else {
        const char **texts = malloc(sizeof *texts * (size_t)n_path);
        if (!texts) return sess_fail(s, SESS_EFAIL, "out of memory");
        for (int i = 0; i < n_path; i++) texts[i] = path[i].text;
        /* the conversation up to the last question, then the last answer's text */
        const char *last = path[n_path - 1].text;
        int bad = prompt_conversation(m, s->chat, doc, texts, n_path - 2, path[n_path - 2].text, &all, &nn, s->err,
                                      sizeof s->err) ||
                  tok_encode(m->vocab, last, strlen(last), 0, 0, &ans, &na, s->err, sizeof s->err);
        free(texts);
        int32_t *joined = bad ? NULL : realloc(all, sizeof(int32_t) * (nn + na + 1));
        if (bad || !joined) {
            free(all);
            free(ans);
            return bad ? SESS_EFAIL : sess_fail(s, SESS_EFAIL, "out of memory");
        }
        all = joined;
        memcpy(all + nn, ans, sizeof(int32_t) * na);
        nn += na;
        free(ans);
    }
    char key[256], e[64];
    sess_current_prefill_key(s, key, sizeof key);
    sess_note(s, "session %lld: no snapshot under %s, prefilling %zu tokens", (long long)s->sid, key, nn);
    run_rewind(s->r, 0, 0, e, sizeof e);
    run_reset_sampler(s->r);
    run_set_question(s->r, 0);   /* the conversation ends with an answer */
    int rc = run_feed(s->r, all, (int64_t)nn, NULL, NULL, s->err, sizeof s->err);
    free(all);
    if (rc) run_rewind(s->r, 0, 0, e, sizeof e);
    return rc;
}

/* The turns of path from index first on (question, answer, ...) appended as their texts tokenize:
 * each question's continuation (the first one's, after the document alone), then its answer. */
static int append_turns(session *s, const sess_message *path, int first, int n_path)
{
    const model *m = run_model(s->r);
    int rc = SESS_OK;
    for (int i = first; rc == SESS_OK && i + 1 < n_path; i += 2) {
        int32_t *q = NULL, *a = NULL;
        size_t nq = 0, na = 0;
        const char *ans = path[i + 1].text;
        s->err[0] = 0;
        if ((i == 0 ? prompt_first_question(m, sess_gemma_turns(s), 1, path[i].text, &q, &nq, s->err, sizeof s->err)
                    : prompt_continue(m, s->chat, path[i].text, &q, &nq, s->err, sizeof s->err)) ||
            tok_encode(m->vocab, ans, strlen(ans), 0, 0, &a, &na, s->err, sizeof s->err) ||
            run_append(s->r, q, (int64_t)nq, s->err, sizeof s->err) ||
            run_append(s->r, a, (int64_t)na, s->err, sizeof s->err))
            rc = s->err[0] ? SESS_EFAIL : sess_fail(s, SESS_EFAIL, "out of memory");
        free(q);
        free(a);
    }
    return rc;
}

/* The newest usable snapshot on the branch before its last one (which is unusable: why), then the
 * turns after it evaluated from their texts. SESS_ENOTFOUND when no older snapshot restores. */
static int resume_from_older(session *s, int64_t sid, const sess_message *path, int n_path, const char *key,
                             const char *why)
{
    char e[1024];
    s->err[0] = 0;
    for (int j = n_path - 3; j >= 1; j -= 2) {
        if (strcmp(path[j].role, "assistant") != 0) continue;
        void *data = NULL;
        size_t len = 0;
        if (s->db.get_snapshot(s->db.ud, path[j].id, key, &data, &len, e, sizeof e) != 0) continue;
        int bad = run_restore(s->r, data, len, s->msha, s->err, sizeof s->err);
        free(data);
        if (bad) continue;
        run_place(s->r);
        int64_t n = sess_seq_len(s), from = run_pos(s->r);
        int rc = append_turns(s, path, j + 1, n_path);
        sess_note(s, "session %lld: the snapshot after the last answer is unusable (%.300s); restored the one after "
                  "answer %d (%lld tokens) and prefilling the %d turns after it (%lld tokens)", (long long)sid, why,
                  (j + 1) / 2, (long long)n, (n_path - 1 - j) / 2, (long long)(sess_seq_len(s) - from));
        if (rc == SESS_OK) rc = run_feed(s->r, NULL, 0, NULL, NULL, s->err, sizeof s->err);
        return rc;
    }
    return SESS_ENOTFOUND;
}

/* The document's snapshot (the same text read before under this prefill policy, in any session) and
 * the turns of path after it. SESS_ENOTFOUND when there is none; doc: the document's text. */
static int resume_from_document(session *s, int64_t sid, const char *doc, const sess_message *path, int n_path)
{
    int32_t *ids = NULL;
    size_t n = 0;
    if (prompt_document(run_model(s->r), sess_gemma_turns(s), doc, &ids, &n, s->err, sizeof s->err)) return SESS_EFAIL;
    double ms;
    int got = sess_restore_doc_snapshot(s, ids, (int64_t)n, &ms);
    free(ids);
    if (got) return SESS_ENOTFOUND;
    s->doc_tokens = (int64_t)n;
    int64_t from = run_pos(s->r);
    int rc = append_turns(s, path, 0, n_path);
    sess_note(s, "session %lld: the document's snapshot restored (%lld tokens) in %.0f ms%s", (long long)sid,
              (long long)from, ms, n_path >= 2 ? "; prefilling the turns after it" : "");
    if (rc == SESS_OK && sess_seq_len(s) > run_pos(s->r)) rc = run_feed(s->r, NULL, 0, NULL, NULL, s->err, sizeof s->err);
    if (rc) {
        char e[64];
        run_rewind(s->r, 0, 0, e, sizeof e);
    }
    return rc;
}

/* The stored conversation key, checked against this model, the document given and the format
 * asked for. SESS_OK with it in st (and the document's text in *given when one was given). */
static int find_stored(session *s, const char *key, const sess_resume_opts *o, sess_stored *st, char **given,
                       size_t *given_len)
{
    char e[1024];
    *given = NULL;
    int f = s->db.find(s->db.ud, key, st, e, sizeof e);
    if (f < 0) return sess_fail(s, SESS_EFAIL, "%s", e);
    if (f == 1)
        return *key ? sess_fail(s, SESS_ENOTFOUND, "no session '%s' (kvchat sessions list shows them)", key)
                    : sess_fail(s, SESS_ENOTFOUND, "no sessions yet");
    if (strcmp(st->model_sha, s->msha) != 0)
        return sess_fail(s, SESS_EMISMATCH, "session %lld was made with another model (%s)", (long long)st->id,
                         st->model_path);
    if (o->doc_path) {
        char sha[65];
        int code;
        if (!(*given = sess_load_document(s, o->doc_path, given_len, &code))) return code;
        snap_sha256_bytes(*given, *given_len, sha);
        if (strcmp(sha, st->doc_sha) != 0) {
            free(*given);
            *given = NULL;
            /* named so the two can be told apart: the same file changed, or two files whose names are
             * the same ("doc.txt, not doc.txt" said nothing), or two names */
            char *rp = realpath(o->doc_path, NULL);
            const char *abs = rp ? rp : o->doc_path;
            const char *base = strrchr(abs, '/') ? strrchr(abs, '/') + 1 : abs;
            const char *sbase = strrchr(st->doc_path, '/') ? strrchr(st->doc_path, '/') + 1 : st->doc_path;
            if (!strcmp(abs, st->doc_path))
                sess_fail(s, SESS_EMISMATCH, "%.500s has changed since session %lld began (sha256 %.12s..., now "
                          "%.12s...): restore that file, or start another session for it", abs, (long long)st->id,
                          st->doc_sha, sha);
            else if (!strcmp(base, sbase))
                sess_fail(s, SESS_EMISMATCH, "session %lld is about %.400s, not %.400s (start another session for "
                          "this document)", (long long)st->id, st->doc_path, abs);
            else
                sess_fail(s, SESS_EMISMATCH, "session %lld is about %.250s, not %.500s (start another session for "
                          "this document)", (long long)st->id, st->doc_title, o->doc_path);
            free(rp);
            return SESS_EMISMATCH;
        }
    }
    if (o->format != SESS_FORMAT_AUTO && o->format != !strcmp(st->format, "chat")) {
        free(*given);
        *given = NULL;
        return sess_fail(s, SESS_EMISMATCH, "session %lld writes its turns in the %s format", (long long)st->id,
                         st->format);
    }
    return SESS_OK;
}

/* The messages along the conversation's newest branch, a question left without an answer (an
 * interrupted turn) left out: it is superseded by the next one. */
static int newest_branch(session *s, const sess_stored *st, int64_t *leaf, sess_message **path, int *n_path,
                         char **unanswered)
{
    char e[1024];
    *leaf = 0;
    *path = NULL;
    *n_path = 0;
    if (s->db.latest(s->db.ud, st->id, leaf, e, sizeof e) || (*leaf && s->db.path(s->db.ud, *leaf, path, n_path, e, sizeof e)))
        return sess_fail(s, SESS_EFAIL, "%s", e);
    while (*n_path > 0 && strcmp((*path)[*n_path - 1].role, "assistant") != 0) {
        *leaf = (*path)[*n_path - 1].parent;
        if (!*unanswered) *unanswered = (*path)[*n_path - 1].text;   /* shown, marked, after the rest */
        else free((*path)[*n_path - 1].text);
        (*n_path)--;
    }
    return SESS_OK;
}

/* The policy the conversation last answered under (its text carries its budget), else the one it
 * began with. */
static int take_stored_policy(session *s, const sess_stored *st, const sess_message *path, int n_path)
{
    const char *pol = n_path > 0 && path[n_path - 1].policy[0] ? path[n_path - 1].policy : st->policy;
    const char *bud = pol == st->policy ? st->budget : "";
    pol_spec spec;
    if (pol_parse(&spec, pol, *bud ? bud : NULL, s->err, sizeof s->err) ||
        run_set_policy(s->r, &spec, s->err, sizeof s->err))
        return SESS_EFAIL;
    s->backtrack = s->cfg.backtrack >= 0 ? s->cfg.backtrack : run_default_backtrack(s->r);
    snprintf(s->cfg.budget, sizeof s->cfg.budget, "%s", bud);
    return SESS_OK;
}

/* The cache from the snapshot data under key; when it is unusable (or could not be read: data NULL,
 * read_err why), from an older one and the turns after it. *replayed: something was prefilled;
 * *none: nothing restored, prefill it all. */
static int restore_stored(session *s, const sess_stored *st, const void *data, size_t len, const char *read_err,
                          const char *key, const sess_message *path, int n_path, int *replayed, int *none)
{
    double t0 = run_clock_s();
    if (!data) snprintf(s->err, sizeof s->err, "%s", read_err);
    else if (run_restore(s->r, data, len, s->msha, s->err, sizeof s->err) == 0) {
        run_place(s->r);   /* kept: on a GPU, the cache goes there now, not with the question */
        s->resumed = 1;
        s->restore_ms = (run_clock_s() - t0) * 1e3;
        /* the positions the cache holds, as the status bar counts the context */
        sess_note(s, "session %lld: restored %lld tokens (%s) from a %.1f MiB snapshot in %.0f ms", (long long)st->id,
                  (long long)run_pos(s->r), key, (double)len / (1 << 20), s->restore_ms);
        return SESS_OK;
    }
    /* the newest snapshot is unusable (corrupt, truncated): an older one on this branch and the
     * turns after it prefilled again, or else the whole conversation from its document */
    char e[1024];
    snprintf(e, sizeof e, "%.1000s", s->err);
    int rc = resume_from_older(s, st->id, path, n_path, key, e);
    *replayed = rc == SESS_OK;
    if (rc != SESS_ENOTFOUND) return rc;
    sess_note(s, "session %lld: the snapshot after the last answer is unusable (%.300s) and no older one is: "
              "prefilling the conversation again", (long long)st->id, e);
    *none = 1;
    return SESS_OK;
}

/* No snapshot under this prefill policy: the document and the conversation are prefilled again,
 * now or (defer) with the next question. */
static int prefill_stored(session *s, const sess_stored *st, char *given, size_t given_len, sess_message *path,
                          int n_path, int defer, int *replayed)
{
    int rc = SESS_OK;
    char *doc = given;
    size_t dl = given_len;
    if (!doc) doc = sess_reload_document(s, st->doc_path, st->doc_sha, &dl, &rc);
    if (!doc) return rc;
    if (defer) {
        s->pending_doc = doc;
        if (n_path > 0 && !(s->pending_turns = calloc((size_t)n_path, sizeof *s->pending_turns)))
            return sess_fail(s, SESS_EFAIL, "out of memory");
        for (int i = 0; i < n_path; i++) {
            s->pending_turns[i] = path[i].text;   /* the texts move to the pending conversation */
            path[i].text = NULL;
            s->n_pending_turns++;
        }
        return SESS_OK;
    }
    rc = replay_conversation(s, doc, path, n_path);
    *replayed = rc == SESS_OK;
    free(doc);
    return rc;
}

int sess_resume(session *s, const char *key, const sess_resume_opts *o)
{
    static const sess_resume_opts plain = { 0, 0, SESS_FORMAT_AUTO, NULL };
    if (!o) o = &plain;
    if (!s->have_db) return sess_fail(s, SESS_ENOTFOUND, "no session database: nothing to resume");
    sess_stored st;
    char *given = NULL;
    size_t given_len = 0;
    int rc = find_stored(s, key, o, &st, &given, &given_len);
    if (rc) return rc;
    int64_t leaf = 0;
    sess_message *path = NULL;
    int n_path = 0;
    char *unanswered = NULL;   /* a question the process was killed before answering */
    if ((rc = newest_branch(s, &st, &leaf, &path, &n_path, &unanswered)) || (o->take_policy && (rc = take_stored_policy(s, &st, path, n_path)))) {
        free(given);
        free(unanswered);
        sess_messages_free(path, n_path);
        return rc;
    }
    char k[256], e[1024] = "";
    sess_current_prefill_key(s, k, sizeof k);
    void *data = NULL;
    size_t len = 0;
    /* g < 0: the store could not put the snapshot together (a page missing or changed, a row that
     * disagrees with its data): like a corrupt snapshot, an older one or a prefill takes its place */
    int g = leaf ? s->db.get_snapshot(s->db.ud, leaf, k, &data, &len, e, sizeof e) : 1;
    for (int i = 0; s->cb.past && i < n_path; i++) s->cb.past(s->cb.ud, path[i].role, path[i].text);
    if (unanswered && s->cb.past) {
        s->cb.past(s->cb.ud, "user", unanswered);
        sess_note(s, "(no answer: interrupted; ask it again to answer it)");
    }
    free(unanswered);
    sess_reset_conversation(s);
    s->have_doc = 0;
    s->chat = !strcmp(st.format, "chat");
    s->sid = st.id;
    s->leaf = leaf;
    snprintf(s->doc_path, sizeof s->doc_path, "%s", st.doc_path);
    snprintf(s->doc_title, sizeof s->doc_title, "%s", st.doc_title);
    snprintf(s->doc_sha, sizeof s->doc_sha, "%s", st.doc_sha);
    snprintf(s->title, sizeof s->title, "%s", st.title);
    snprintf(s->name, sizeof s->name, "%s", st.name);
    int replayed = 0, none = g > 0;   /* replayed: prefilled now, in whole or in part */
    if (g <= 0) rc = restore_stored(s, &st, g == 0 ? data : NULL, len, e, k, path, n_path, &replayed, &none);
    else {   /* none after the last answer: an older one and the turns after it */
        char why[300];
        snprintf(why, sizeof why, "there is none under %.200s", k);
        int r2 = resume_from_older(s, st.id, path, n_path, k, why);
        if (r2 != SESS_ENOTFOUND) {
            none = 0;
            replayed = r2 == SESS_OK;
            rc = r2;
        }
    }
    if (none) {   /* else the document's snapshot, read before in any session, and the turns */
        size_t dl = given_len;
        char *doc = given ? given : sess_reload_document(s, st.doc_path, st.doc_sha, &dl, &rc);
        int r2 = doc ? resume_from_document(s, st.id, doc, path, n_path) : SESS_ENOTFOUND;
        if (doc && r2 != SESS_ENOTFOUND) {
            none = 0;
            replayed = r2 == SESS_OK && n_path >= 2;
            rc = r2;
        }
        if (doc != given) free(doc);
        rc = none ? SESS_OK : rc;
    }
    if (none) {
        rc = prefill_stored(s, &st, given, given_len, path, n_path, o->defer, &replayed);
        given = NULL;
    }
    if (replayed && leaf) {   /* filed under the last answer, so the next resume under this policy is instant */
        size_t sl;
        if (sess_save_snapshot(s, leaf, &sl) == 0)
            sess_note(s, "session %lld: its snapshot under %s is saved: the next resume is instant", (long long)st.id, k);
        else
            sess_note(s, "session %lld: the snapshot could not be saved (%.600s)", (long long)st.id, s->err);
    }
    free(given);
    free(data);
    if (rc == SESS_OK) {
        s->turns = n_path / 2;
        s->turn_base = s->turns;
        s->have_doc = 1;
        if (!s->pending_doc) run_set_floor(s->r, run_pos(s->r));
    } else {
        sess_reset_conversation(s);
        s->have_doc = 0;
    }
    sess_messages_free(path, n_path);
    return rc;
}
