/* worker.h - the engine thread behind the TUI: the screen never waits on the model.
 *
 * The worker owns the engine session (engine/session.h: the conversation, its model, cache and
 * policies) and runs one job at a time on it (open a document, answer a question, switch policy,
 * ...). The UI submits jobs and drains events (text pieces, progress, the end of a job, errors)
 * without blocking; it reads live figures from a copy the worker publishes under a mutex after
 * every chunk and token (memory, the page map, entropy history). */
#ifndef KVCHAT_UI_WORKER_H
#define KVCHAT_UI_WORKER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/sampler.h"
#include "engine/session.h"
#include "store/store.h"
#include "ui/view.h"

typedef enum {
    UW_TEXT,
    UW_PROGRESS,
    UW_DONE,
    UW_ERROR,
    UW_INFO,
    UW_EVENT,
    UW_PAST_USER,
    UW_PAST_ANSWER,
    UW_SEEN,          /* new "what the model sees" spans while the view is open (uw_take_seen) */
    UW_SEPARATOR,     /* another conversation begins here (text: what it is) */
} uw_kind;

typedef struct uw_event {
    uw_kind kind;
    char text[512];          /* a piece of the answer, or a message */
    int64_t a, b;            /* progress: done, total */
} uw_event;


/* "What the model sees": the sequence as text spans (sess_seen). */
typedef sess_span uw_span;

/* One answer of a comparison. */
typedef struct uw_compared {
    char policy[256];
    char figures[160];
    char *text;
} uw_compared;

typedef struct ui_worker ui_worker;

/* Start the thread on session s (made on the calling thread before the screen opens), saving into
 * db (may be NULL; db_path: its file, for the session browser's own connection). The worker owns
 * both from now on. NULL with a message (nothing is owned then). */
ui_worker *uw_start(session *s, store *db, const char *db_path, char *err, size_t errlen);
void uw_stop(ui_worker *w);
/* 0, or -1 when a job is still running. path is copied. */
int uw_open(ui_worker *w, const char *path);
int uw_ask(ui_worker *w, const char *question);
/* Continue a saved session (its name or id; "" for the most recent one): the transcript comes back
 * as UW_PAST_* events and the cache from its snapshot (or a prefill when it has none for the
 * current policy). */
int uw_resume(ui_worker *w, const char *key);
/* Build the "what the model sees" spans (a job; UW_DONE with b = 2 when they are ready), then take
 * them (the caller frees each text and the array). While live is on, the worker builds them again
 * as an answer streams (at most twice a second) and after every job, and posts UW_SEEN. */
int uw_request_seen(ui_worker *w);
uw_span *uw_take_seen(ui_worker *w, int *n);
void uw_seen_live(ui_worker *w, int live);
/* The next resume keeps the interface's policy instead of taking the session's own (a --policy on
 * the command line); later ones take the session's own. */
void uw_keep_policy_once(ui_worker *w);

/* "SPEC[,SPEC...] QUESTION": the question answered under the current policy and each listed
 * decode-time policy, from the same cache, without entering the conversation (UW_DONE with b = 3
 * when done); take the answers (up to 8, texts belong to the caller). */
int uw_compare(ui_worker *w, const char *arg);
int uw_take_compared(ui_worker *w, uw_compared *out);
/* "N TEXT": ask TEXT instead of question N as a new branch: from the turn's recorded start when it
 * was asked in this window, else by prefilling the document and the conversation before it again
 * (from the session's messages). */
int uw_edit(ui_worker *w, const char *arg);

/* Another answer to the last question, saved as a new branch beside the first. */
int uw_regenerate(ui_worker *w);
/* Switch policy (a job: UW_DONE with b = 4 when done). A new decode-time policy applies to the next
 * answer. A new prefill policy with a document loaded restores the conversation's snapshot under
 * that policy when the session has one, else prefills the whole sequence again under it (with
 * progress; Ctrl-C goes back to the old policy). budget NULL keeps the current one. 0, or -1 with a
 * message (busy, or a spec that does not parse). */
int uw_set_policy(ui_worker *w, const char *spec, const char *budget, char *err, size_t errlen);
/* The checks uw_set_policy makes (the engine's, shared by every front end), without switching: 0, or
 * -1 with a message (also when busy). */
int uw_check_policy(ui_worker *w, const char *spec, const char *budget, char *err, size_t errlen);
/* Sampling settings and the answer length, for the next answer on. */
void uw_set_sampling(ui_worker *w, const samp_params *sp, int64_t n_predict);
/* The session database's path (NULL with --no-db or when it could not be opened). */
const char *uw_db_path(const ui_worker *w);
/* Stop the running job as soon as possible (prefill: before the next layer; answer: at the next
 * token; the partial answer stays). */
void uw_cancel(ui_worker *w);
/* Next event, 1; 0 when there is none. */
int uw_poll(ui_worker *w, uw_event *ev);
void uw_get_view(ui_worker *w, uw_view *v);

#endif
