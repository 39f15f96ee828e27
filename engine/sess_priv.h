/* sess_priv.h - the session's private state, shared by the files that implement session.h, each
 * one concept over the run (engine/run.h): sess_store.c (persistence), sess_doc.c (documents),
 * sess_turns.c (questions, answers, regenerations, branches), sess_resume.c, sess_compare.c, and
 * session.c (the object, policies, the lower-level feeding). They call one another one way only,
 * in that order, through sess_store.h, sess_doc.h and sess_turns.h (scripts/check_layers.sh checks
 * the includes). Not for front ends. */
#ifndef KVCHAT_SESS_PRIV_H
#define KVCHAT_SESS_PRIV_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "engine/run.h"
#include "engine/session.h"

#define SESS_MAX_TURNS 64

struct session {
    sess_config cfg;
    run *r;
    int backtrack;               /* regenerations per answer */
    int chat;                    /* turns in the model's chat template (1) or the plain form (0) */
    int max_piece;               /* the most bytes one token of the vocabulary stands for */
    char err[1200];
    int policy_pending;          /* switched since the last answer without a rebuild: acts from the next */
    sess_callbacks cb;
    volatile sig_atomic_t *abort_flag;
    volatile sig_atomic_t never;   /* what abort_flag points at until a caller gives one */
    /* the document */
    int have_doc;
    char doc_path[1024], doc_title[256], doc_sha[65], title[256], name[128];
    int64_t doc_tokens;
    char *pending_doc;           /* deferred: prefilled with the next question */
    char **pending_turns;        /* deferred resume without a snapshot: the conversation's texts */
    int n_pending_turns;
    /* the turns: where each asked through this object began (cache position, sequence length,
     * sampler state, the message it replies to), so a branch rewinds to an exact point */
    int64_t turns;               /* questions answered in this conversation */
    int64_t turn_pos[SESS_MAX_TURNS], turn_seq[SESS_MAX_TURNS], turn_parent[SESS_MAX_TURNS];
    void *turn_samp[SESS_MAX_TURNS];
    int n_turns_here;            /* turns recorded (0 .. SESS_MAX_TURNS) */
    int64_t turn_base;           /* the conversation's turn number of record 0 */
    int pending_record;          /* the turn being prepared is recorded at this index (-1: none) */
    /* the last answer */
    char *answer;
    size_t ans_len, ans_cap;
    int32_t *ans_ids;
    int64_t ans_n, ans_cap_ids;
    sess_answer last;
    char *last_q;
    int64_t ans_start, seq_ans;  /* where the last answer began: cache position, sequence length */
    int64_t last_user;           /* the message the last answer replied to (a regeneration's parent) */
    int resumed;                 /* the cache came from a snapshot since the last answer */
    double restore_ms;
    /* persistence */
    sess_persist db;
    int have_db;
    int64_t sid, leaf;
    char msha[65];
    /* the decision trace (sess_trace): the text followed and its positions once found */
    char *trace_text;
    int64_t trace_lo, trace_hi;
};

/* Set the message and return code (a printf-style helper keeps call sites one line). The message
 * is formatted apart and then copied: an argument may be s->err itself ("not saved: %s", s->err),
 * which formatting into s->err would read while writing it. */
static inline int sess_fail(session *s, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static inline int sess_fail(session *s, int code, const char *fmt, ...)
{
    char msg[sizeof s->err];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(s->err, msg, sizeof msg);
    return code;
}

/* Tell the front end what the session did ("restored ..."). */
static inline void sess_note(session *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void sess_note(session *s, const char *fmt, ...)
{
    if (!s->cb.note) return;
    char msg[1600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    s->cb.note(s->cb.ud, msg);
}

static inline int sess_cancelled(const session *s) { return *s->abort_flag != 0; }

/* The sequence's length (its ids, the last sampled one of an answer included). */
static inline int64_t sess_seq_len(const session *s)
{
    int64_t n;
    run_tokens(s->r, &n);
    return n;
}

/* Where a regeneration rewinds to: before the last answer, or the end of what the cache holds. */
static inline void sess_set_regen_floor(session *s)
{
    run_set_floor(s->r, s->turns > 0 && s->ans_start > 0 ? s->ans_start - 1 : run_pos(s->r));
}

#endif
