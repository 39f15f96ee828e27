/* sess_doc.c - a session's document (see sess_doc.h and sess_open_document in session.h): the
 * text read and checked, its fit, the prefill now or deferred to the first question, and the
 * conversation it replaces kept until the new one is in. */
#include "engine/sess_doc.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/chat.h"
#include "engine/document.h"
#include "engine/prompt.h"
#include "engine/snapshot.h"
#include "engine/sess_reuse.h"

static const char *base_name(const char *p)
{
    const char *b = strrchr(p, '/');
    return b ? b + 1 : p;
}

int sess_gemma_turns(const session *s) { return s->chat && chat_family_for(run_model(s->r)->gguf) == CHAT_GEMMA; }

void sess_clear_pending(session *s)
{
    free(s->pending_doc);
    s->pending_doc = NULL;
    for (int i = 0; i < s->n_pending_turns; i++) free(s->pending_turns[i]);
    free(s->pending_turns);
    s->pending_turns = NULL;
    s->n_pending_turns = 0;
}

void sess_reset_conversation(session *s)
{
    char e[64];
    run_rewind(s->r, 0, 0, e, sizeof e);
    run_reset_sampler(s->r);
    sess_clear_pending(s);
    s->turns = 0;
    s->turn_base = 0;
    s->n_turns_here = 0;
    s->pending_record = -1;
    s->sid = s->leaf = s->last_user = 0;
    s->ans_start = s->seq_ans = 0;
    s->resumed = 0;
    s->policy_pending = 0;   /* a new conversation is built under the policy as it is */
    free(s->last_q);
    s->last_q = NULL;
    s->ans_len = 0;
    if (s->answer) s->answer[0] = 0;
    s->ans_n = 0;
}

void sess_drop_document(session *s)
{
    char e[64];
    run_rewind(s->r, 0, 0, e, sizeof e);
    s->have_doc = 0;
}

/* The loaded conversation, kept while another document is prefilled, so a cancel or a failure goes
 * back to it exactly (its cache from a snapshot in memory, the rest as it was). */
typedef struct kept_conv {
    void *snap;
    size_t snap_len;
    char doc_path[1024], doc_title[256], doc_sha[65], title[256], name[128];
    int64_t doc_tokens, turns, turn_base, sid, leaf, last_user, ans_start, seq_ans;
    int n_turns_here;
    char *last_q;
} kept_conv;

static int keep_conversation(session *s, kept_conv *k)
{
    memset(k, 0, sizeof *k);
    if (!s->have_doc || s->pending_doc || sess_seq_len(s) == 0) return 0;
    if (run_snapshot(s->r, s->msha, &k->snap, &k->snap_len, s->err, sizeof s->err)) return -1;
    memcpy(k->doc_path, s->doc_path, sizeof k->doc_path);
    memcpy(k->doc_title, s->doc_title, sizeof k->doc_title);
    memcpy(k->doc_sha, s->doc_sha, sizeof k->doc_sha);
    memcpy(k->title, s->title, sizeof k->title);
    memcpy(k->name, s->name, sizeof k->name);
    k->doc_tokens = s->doc_tokens;
    k->turns = s->turns;
    k->turn_base = s->turn_base;
    k->sid = s->sid;
    k->leaf = s->leaf;
    k->last_user = s->last_user;
    k->ans_start = s->ans_start;
    k->seq_ans = s->seq_ans;
    k->n_turns_here = s->n_turns_here;
    k->last_q = s->last_q;   /* resetting the conversation must not free it now */
    s->last_q = NULL;
    return 0;
}

/* Back to the kept conversation; 0, or -1 when its cache could not be restored (none is loaded). */
static int restore_conversation(session *s, kept_conv *k)
{
    if (!k->snap || run_restore(s->r, k->snap, k->snap_len, s->msha, s->err, sizeof s->err)) return -1;
    run_place(s->r);
    memcpy(s->doc_path, k->doc_path, sizeof k->doc_path);
    memcpy(s->doc_title, k->doc_title, sizeof k->doc_title);
    memcpy(s->doc_sha, k->doc_sha, sizeof k->doc_sha);
    memcpy(s->title, k->title, sizeof k->title);
    memcpy(s->name, k->name, sizeof k->name);
    s->doc_tokens = k->doc_tokens;
    s->turns = k->turns;
    s->turn_base = k->turn_base;
    s->sid = k->sid;
    s->leaf = k->leaf;
    s->last_user = k->last_user;
    s->ans_start = k->ans_start;
    s->seq_ans = k->seq_ans;
    s->n_turns_here = k->n_turns_here;
    free(s->last_q);
    s->last_q = k->last_q;
    k->last_q = NULL;
    s->have_doc = 1;
    sess_set_regen_floor(s);
    return 0;
}

static void kept_free(kept_conv *k)
{
    free(k->snap);
    free(k->last_q);
    memset(k, 0, sizeof *k);
}

/* The most bytes a document that fits the context can have: every token stands for at most
 * max_piece bytes of text. */
static size_t doc_cap(const session *s) { return (size_t)run_n_ctx(s->r) * (size_t)s->max_piece; }

char *sess_load_document(session *s, const char *path, size_t *len, int *code)
{
    struct stat st;
    size_t cap = doc_cap(s);
    *code = SESS_EFAIL;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size > cap) {
        *code = SESS_ENOFIT;
        sess_fail(s, SESS_ENOFIT, "%s is %lld bytes, so at least %lld tokens (a token of this model stands for at most "
                  "%d bytes): longer than the context of %lld tokens (use --ctx or a shorter document)", path,
                  (long long)st.st_size, (long long)(st.st_size / s->max_piece), s->max_piece,
                  (long long)run_n_ctx(s->r));
        return NULL;
    }
    return doc_load(path, cap, len, s->err, sizeof s->err);
}

char *sess_reload_document(session *s, const char *path, const char *want_sha, size_t *len, int *code)
{
    char *doc = sess_load_document(s, path, len, code);
    if (!doc) return NULL;
    char sha[65];
    snap_sha256_bytes(doc, *len, sha);
    if (want_sha && *want_sha && strcmp(sha, want_sha) != 0) {
        free(doc);
        *code = SESS_EMISMATCH;
        sess_fail(s, SESS_EMISMATCH, "%s has changed since the conversation began (sha256 %.12s..., now %.12s...): "
                  "restore that file, or start a new conversation about it", path, want_sha, sha);
        return NULL;
    }
    *code = SESS_OK;
    return doc;
}

/* Prefill the document's tokens now (after the conversation it replaces was kept aside), or restore
 * them from the snapshot of the same text read before under this policy. */
static int prefill_document(session *s, const char *path, const int32_t *ids, size_t n, kept_conv *kept)
{
    const model_hparams *hp = &run_model(s->r)->hp;
    uint64_t full = (uint64_t)n * (uint64_t)hp->n_layer * (uint64_t)hp->n_head_kv * (uint64_t)hp->head_dim * 4u;
    double ms;
    int restored = sess_restore_doc_snapshot(s, ids, (int64_t)n, &ms) == 0, rc = SESS_OK;
    if (restored) {
        char key[256];
        sess_current_prefill_key(s, key, sizeof key);
        sess_note(s, "%.700s: %zu tokens of %lld, read before: restored from its snapshot under %.200s in %.0f ms", path,
                  n, (long long)run_n_ctx(s->r), key, ms);
    } else {
        sess_note(s, "%.700s: %zu tokens of %lld, a full cache would need %.1f MiB; prefilling under %.250s", path, n,
                  (long long)run_n_ctx(s->r), (double)full / (1 << 20), pol_set_spec(run_policies(s->r))->text);
        run_set_question(s->r, 0);   /* no question yet: the probe is the document's end */
        rc = run_feed(s->r, ids, (int64_t)n, NULL, NULL, s->err, sizeof s->err);
    }
    if (rc) {
        char e[1100];
        snprintf(e, sizeof e, "%.1000s", rc == SESS_ECANCELLED ? "prefill cancelled" : s->err);
        sess_drop_document(s);
        if (!kept->snap)
            sess_fail(s, rc, "%s; no document is loaded", e);
        else if (restore_conversation(s, kept) == 0)
            sess_fail(s, rc, "%s; back to %.250s as it was", e, s->doc_title);
        else
            sess_fail(s, rc, "%s; the conversation before it could not be restored (%.300s): no document is loaded", e,
                      s->err);
        return rc;
    }
    s->have_doc = 1;
    run_set_floor(s->r, run_pos(s->r));
    char d[1024];
    pol_set_describe(run_policies(s->r), d, sizeof d);
    sess_note(s, "%s", d[0] ? d : "document loaded");
    if (sess_ensure_stored(s)) {
        char e[1200];
        snprintf(e, sizeof e, "%.1000s", s->err);
        return sess_fail(s, SESS_ESAVE, "this conversation is %.1100s", e);
    }
    if (!restored) sess_save_doc_snapshot(s);   /* the next open of this text, here or in any session, restores it */
    return SESS_OK;
}

int sess_prefill_waits_for_question(const char *prefill_key) { return strcmp(prefill_key, POL_FULL) != 0; }

void sess_note_waiting(session *s, const char *prefill_key)
{
    sess_note(s, "%.200s: %lld tokens; %.200s compresses with the question in view, so the document is read with "
              "your first question (follow-ups read what it kept for that one)",
              s->doc_title, (long long)s->doc_tokens, prefill_key);
}

int sess_open_document(session *s, const char *given, const char *title, const char *name, int defer)
{
    size_t len;
    char abs_path[1024];
    int from_stdin = !strcmp(given, "-");
    /* the conversation keeps the absolute path, so it resumes from any directory */
    char *rp = from_stdin ? NULL : realpath(given, NULL);
    snprintf(abs_path, sizeof abs_path, "%s", rp && strlen(rp) < sizeof abs_path ? rp : given);
    free(rp);
    char key[256];
    sess_current_prefill_key(s, key, sizeof key);
    int auto_defer = defer == SESS_DEFER_PREFILL_POLICY;
    if (auto_defer) defer = sess_prefill_waits_for_question(key);
    int code;
    char *text = sess_load_document(s, abs_path, &len, &code);
    if (!text) return code;
    if (strspn(text, " \t\r\n\f\v") == len) {
        free(text);
        return sess_fail(s, SESS_EFAIL, "%s is empty%s: nothing to ask about",
                         from_stdin ? "the standard input" : given, len ? " (only white space)" : "");
    }
    char sha[65];
    snap_sha256_bytes(text, len, sha);
    int32_t *ids = NULL;
    size_t n = 0;
    /* the document alone, the way its turn continues with the first question; say whether it fits
     * before spending time on it (a deferred one too: the interface says so at once, not at the
     * first question): a document is never cut */
    if (prompt_document(run_model(s->r), sess_gemma_turns(s), text, &ids, &n, s->err, sizeof s->err)) {
        free(text);
        return SESS_EFAIL;
    }
    int64_t limit = run_n_ctx(s->r);
    if ((int64_t)n + (defer ? 0 : 64) > limit) {   /* deferred: the question's own check counts the rest */
        free(ids);
        free(text);
        return sess_fail(s, SESS_ENOFIT, "%s is %zu tokens, longer than the context of %lld tokens%s (use --ctx or a "
                         "shorter document)", abs_path, n, (long long)limit, defer ? "" : " with room to answer");
    }
    kept_conv kept;
    if (!defer && keep_conversation(s, &kept)) {
        free(ids);
        free(text);
        return SESS_EFAIL;
    }
    sess_reset_conversation(s);
    s->have_doc = 0;
    const char *label = from_stdin ? "stdin" : base_name(abs_path);
    snprintf(s->doc_path, sizeof s->doc_path, "%s", abs_path);
    snprintf(s->doc_title, sizeof s->doc_title, "%.250s", label);
    snprintf(s->title, sizeof s->title, "%.200s", title ? title : label);
    snprintf(s->name, sizeof s->name, "%s", name ? name : "");
    snprintf(s->doc_sha, sizeof s->doc_sha, "%s", sha);
    s->doc_tokens = (int64_t)n;
    if (defer) {
        free(ids);
        s->pending_doc = text;
        s->have_doc = 1;
        if (auto_defer) sess_note_waiting(s, key);
        return SESS_OK;
    }
    free(text);
    int rc = prefill_document(s, abs_path, ids, n, &kept);
    free(ids);
    kept_free(&kept);
    return rc;
}
