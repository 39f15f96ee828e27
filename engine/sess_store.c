/* sess_store.c - a session's persistence (see sess_store.h): what the conversation writes through
 * the sess_persist table that store/ implements; the engine never sees sqlite. */
#include "engine/sess_store.h"

#include <stdlib.h>
#include <string.h>

void sess_messages_free(sess_message *m, int n)
{
    for (int i = 0; m && i < n; i++) free(m[i].text);
    free(m);
}

void sess_prefill_key(const pol_spec *spec, char *buf, size_t cap)
{
    /* the spec text lists the prefill policy first when there is one: "take:...+chess" */
    snprintf(buf, cap, "%s", POL_FULL);
    for (int i = 0; i < spec->n; i++) {
        if (spec->ops[i]->stage != POL_STAGE_PREFILL) continue;
        const char *plus = strchr(spec->text, '+');
        size_t n = plus ? (size_t)(plus - spec->text) : strlen(spec->text);
        snprintf(buf, cap, "%.*s", (int)n, spec->text);
    }
}

void sess_current_prefill_key(const session *s, char *buf, size_t cap)
{
    sess_prefill_key(pol_set_spec(run_policies(s->r)), buf, cap);
}

int sess_ensure_stored(session *s)
{
    if (s->sid || !s->have_db || !s->have_doc) return SESS_OK;
    sess_stored st;
    memset(&st, 0, sizeof st);
    snprintf(st.name, sizeof st.name, "%s", s->name);
    snprintf(st.title, sizeof st.title, "%s", s->title);
    snprintf(st.model_sha, sizeof st.model_sha, "%s", s->msha);
    snprintf(st.model_path, sizeof st.model_path, "%s", run_model(s->r)->path);
    snprintf(st.doc_path, sizeof st.doc_path, "%s", s->doc_path);
    snprintf(st.doc_sha, sizeof st.doc_sha, "%s", s->doc_sha);
    snprintf(st.doc_title, sizeof st.doc_title, "%s", s->doc_title);
    snprintf(st.policy, sizeof st.policy, "%s", pol_set_spec(run_policies(s->r))->text);
    snprintf(st.budget, sizeof st.budget, "%s", s->cfg.budget);
    snprintf(st.format, sizeof st.format, "%s", s->chat ? "chat" : "plain");
    char e[1024];
    if (s->db.create(s->db.ud, &st, s->doc_tokens, &s->sid, e, sizeof e)) {
        s->sid = 0;
        return sess_fail(s, SESS_ESAVE, "not saved: %s", e);
    }
    return SESS_OK;
}

int sess_save_snapshot(session *s, int64_t msg, size_t *len)
{
    char key[256], e[1024];
    void *data;
    sess_current_prefill_key(s, key, sizeof key);
    if (run_snapshot(s->r, s->msha, &data, len, s->err, sizeof s->err)) return -1;
    int bad = s->db.put_snapshot(s->db.ud, s->sid, msg, key, sess_seq_len(s), data, *len, e, sizeof e);
    free(data);
    if (bad) snprintf(s->err, sizeof s->err, "%s", e);
    return bad ? -1 : 0;
}

/* The answer of the turn, after its question (saved before the answer began, or now: a regeneration
 * replies to the first question's row) and its events. */
static int save_messages(session *s, const char *question, int regen, int64_t saved_user, const char *metrics,
                         int64_t *um, int64_t *am, char *e, size_t elen)
{
    int n_ev;
    const unc_event *ev = unc_events(run_monitor(s->r), &n_ev);
    const char *pol = pol_set_spec(run_policies(s->r))->text;
    if (regen)
        *um = s->last_user;
    else if (saved_user)
        *um = saved_user;
    else if (s->db.add_message(s->db.ud, s->sid, s->leaf, "user", question, pol, NULL, um, e, elen))
        return -1;
    s->last_user = *um;
    if (s->db.add_message(s->db.ud, s->sid, *um, "assistant", s->answer ? s->answer : "", pol, metrics, am, e, elen) ||
        s->db.add_events(s->db.ud, *am, ev, n_ev, e, elen))
        return -1;
    return 0;
}

/* When the stored conversation was deleted meanwhile (by another kvchat), a new one is made for it
 * (its earlier messages are gone; the cache, whose snapshot follows, is whole). 1 when it was, 0 when
 * the row is there, -1 on failure. */
static int reattach_if_deleted(session *s)
{
    char key[32], e[1024];
    sess_stored st;
    snprintf(key, sizeof key, "#%lld", (long long)s->sid);
    if (s->db.find(s->db.ud, key, &st, e, sizeof e) != 1) return 0;
    int64_t old = s->sid;
    s->sid = s->leaf = s->last_user = 0;
    if (sess_ensure_stored(s)) return -1;
    sess_note(s, "session %lld was deleted meanwhile (by another kvchat): this conversation goes on as session %lld, "
              "without the earlier messages", (long long)old, (long long)s->sid);
    return 1;
}

int sess_save_question(session *s, const char *question)
{
    s->last.user_msg = 0;
    if (!s->have_db || !s->have_doc) return SESS_OK;
    int rc = sess_ensure_stored(s);
    if (rc) return rc;
    char e[1024];
    const char *pol = pol_set_spec(run_policies(s->r))->text;
    int64_t um;
    if (s->db.add_message(s->db.ud, s->sid, s->leaf, "user", question, pol, NULL, &um, e, sizeof e)) {
        /* the conversation's row may be gone (deleted by another kvchat): it goes on as a new one */
        int r = reattach_if_deleted(s);
        if (r < 0) return sess_fail(s, SESS_ESAVE, "the question is not saved (%.900s)", s->err);
        if (r == 0 || s->db.add_message(s->db.ud, s->sid, s->leaf, "user", question, pol, NULL, &um, e, sizeof e))
            return sess_fail(s, SESS_ESAVE, "the question is not saved (%s)", e);
    }
    s->last.user_msg = um;
    return SESS_OK;
}

int sess_save_turn(session *s, const char *question, int regen)
{
    sess_answer *a = &s->last;
    int64_t saved_user = regen ? 0 : a->user_msg;   /* the question's row, saved as the answer began */
    a->saved[0] = 0;
    a->user_msg = a->answer_msg = 0;
    a->snapshot_bytes = 0;
    if (!s->have_db || !s->have_doc) return SESS_OK;
    int rc = sess_ensure_stored(s);
    if (rc) return rc;
    char mj[1024], e[1024];
    run_figures fg;
    run_get_figures(s->r, &fg);
    snprintf(mj, sizeof mj,
             "{\"interrupted\": %s, \"policy\": \"%s\", \"prompt_tokens\": %lld, \"answer_tokens\": %lld, "
             "\"prefill_s\": %.3f, \"decode_s\": %.3f, \"kv_bytes\": %llu, \"kv_full_bytes\": %llu, \"events\": %d, "
             "\"regenerated\": %d, \"resumed_from_snapshot\": %s, \"restore_ms\": %.1f}",
             a->gen.stop == GEN_STOP_INTERRUPT ? "true" : "false", pol_set_spec(run_policies(s->r))->text,
             (long long)a->prompt_tokens, (long long)a->gen.n_gen, a->prefill_s, a->decode_s,
             (unsigned long long)fg.kv_held, (unsigned long long)fg.kv_full, a->gen.events,
             a->gen.regenerated, a->resumed ? "true" : "false", a->restore_ms);
    int64_t um, am;
    if (save_messages(s, question, regen, saved_user, mj, &um, &am, e, sizeof e)) {
        /* the conversation's row may be gone (deleted by another kvchat): it goes on as a new one,
         * the question saved again into it */
        int r = reattach_if_deleted(s);
        if (r < 0) return sess_fail(s, SESS_ESAVE, "the turn is not saved (%.900s)", s->err);
        if (r == 0 || save_messages(s, question, 0, 0, mj, &um, &am, e, sizeof e))
            return sess_fail(s, SESS_ESAVE, "the turn is not saved (%s)", e);
    }
    s->leaf = am;
    a->user_msg = um;
    a->answer_msg = am;
    double t0 = run_clock_s();
    size_t len;
    if (sess_save_snapshot(s, am, &len))
        return sess_fail(s, SESS_ESAVE, "the turn is saved in session %lld, its snapshot is not (%.900s)",
                         (long long)s->sid, s->err);
    a->save_ms = (run_clock_s() - t0) * 1e3;
    a->snapshot_bytes = len;
    snprintf(a->saved, sizeof a->saved, "session %lld (snapshot %.1f MiB)", (long long)s->sid,
             (double)len / (1 << 20));
    return SESS_OK;
}
