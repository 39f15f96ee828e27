/* session.h - one conversation about a document: the engine object every front end drives.
 *
 * A session is a conversation over a run (engine/run.h, which holds the model, backend, cache,
 * policies, sampler and monitor): the document, the turns and where each began, the last answer,
 * the stored conversation. It opens a document (fit check, chunked prefill with progress and an
 * abort flag), answers questions (final text and uncertainty events through callbacks,
 * backtracking included), regenerates the last answer, branches at question N, switches policy
 * (restoring a stored state when one exists, else prefilling again; exactly as before on cancel or
 * failure), compares decode-time policies on one cache, and saves and resumes through
 * sess_persist, a table of functions that store/ implements, so the engine never sees sqlite.
 * Nothing here prints: an operation returns a status and leaves its message in sess_error(). One
 * thread drives a session. */
#ifndef KVCHAT_SESSION_H
#define KVCHAT_SESSION_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/run.h"

typedef struct session session;

/* What an operation returns; sess_error() says what happened. On anything but SESS_OK (and
 * SESS_ESAVE, where the answer stands) the conversation is as it was before the call, except that
 * a document or a stored conversation that fails to load part way leaves none loaded. */
enum sess_status {
    SESS_OK = 0,
    SESS_EFAIL = -1,       /* a failure: bad input, out of memory, a failed device op */
    SESS_ECANCELLED = -2,  /* the abort flag was raised */
    SESS_ENOFIT = -3,      /* the document or the turn does not fit in the context */
    SESS_ENOTFOUND = -4,   /* no such stored conversation, question or answer */
    SESS_EMISMATCH = -5,   /* a stored conversation of another model or another document */
    SESS_ESAVE = -6,       /* answered, but saving the turn failed (the answer stands, unsaved) */
};

#define SESS_MAX_STOP 8
enum { SESS_FORMAT_AUTO = -1, SESS_FORMAT_PLAIN = 0, SESS_FORMAT_CHAT = 1 };

/* How the conversation answers (the run has the model, the device, the policies, the sampling). */
typedef struct sess_config {
    char budget[32];             /* the --budget text policies switched to later are parsed with ("" none) */
    int backtrack;               /* regenerations per answer (-1: 2 when the decode policy can reselect) */
    int64_t n_predict;           /* the longest answer (0: 128) */
    int format;                  /* SESS_FORMAT_*: AUTO is the chat template when the file has one */
    int monitor;                 /* keep each answer token's entropy even without thresholds (a UI draws it) */
    char stop[SESS_MAX_STOP][128];   /* stop sequences of every answer, besides the plain form's own
                                        next turn ("\nQuestion:"), which always stops an answer */
    int n_stop;
    int answer_end;              /* PROMPT_END_* (engine/prompt.h): where a plain-form answer ends
                                    (0: at its first blank line) */
} sess_config;

/* What a session reports while it works; any member may be NULL. */
typedef struct sess_callbacks {
    void *ud;
    void (*progress)(void *ud, int64_t done, int64_t total);       /* prefill */
    void (*text)(void *ud, const char *piece, size_t n);           /* answer text, once final */
    void (*page)(void *ud, int64_t page, const unc_stats *s);      /* an answer page passed its check */
    void (*event)(void *ud, const unc_event *e);                   /* an uncertainty event */
    void (*note)(void *ud, const char *msg);                       /* what the session did ("restored ...") */
    void (*past)(void *ud, const char *role, const char *text);    /* a resumed conversation's messages */
    /* sess_compare: column i of n (policy) begins (tokens 0), or got a token, the columns' tokens
     * so far then in tokens (they are decoded together) */
    void (*column)(void *ud, int i, int n, const char *policy, int64_t tokens);
} sess_callbacks;

/* ---- persistence: what store/ implements (store/persist.c) */

typedef struct sess_stored {     /* a stored conversation */
    int64_t id;
    char name[128], title[256];
    char model_sha[65], model_path[1024];
    char doc_path[1024], doc_sha[65], doc_title[256];
    char policy[256], budget[32];
    char format[16];             /* "chat" or "plain" */
} sess_stored;

typedef struct sess_message {
    int64_t id, parent;
    char role[16];               /* "user" or "assistant" */
    char policy[256];            /* the policy it was asked or answered under ("" unknown) */
    char *text;                  /* malloc'd */
} sess_message;

/* Every function returns 0, or -1 with a one-line message in err (get functions: 1 when absent). */
typedef struct sess_persist {
    void *ud;
    /* The model file's sha256 (snapshots name it), registering the file. */
    int (*model)(void *ud, const char *path, const model *m, char sha[65], char *err, size_t errlen);
    /* A conversation by name or id; key "" is the most recent. */
    int (*find)(void *ud, const char *key, sess_stored *out, char *err, size_t errlen);
    int (*create)(void *ud, const sess_stored *s, int64_t doc_tokens, int64_t *id, char *err, size_t errlen);
    /* The newest message of a conversation (0 when it has none). */
    int (*latest)(void *ud, int64_t session, int64_t *message, char *err, size_t errlen);
    /* The messages from the root down to message, in order; free with sess_messages_free. */
    int (*path)(void *ud, int64_t message, sess_message **out, int *n, char *err, size_t errlen);
    int (*add_message)(void *ud, int64_t session, int64_t parent, const char *role, const char *text,
                       const char *policy, const char *metrics, int64_t *id, char *err, size_t errlen);
    int (*add_events)(void *ud, int64_t message, const unc_event *e, int n, char *err, size_t errlen);
    int (*get_snapshot)(void *ud, int64_t message, const char *key, void **data, size_t *len, char *err,
                        size_t errlen);
    int (*put_snapshot)(void *ud, int64_t session, int64_t message, const char *key, int64_t n_tokens,
                        const void *data, size_t len, char *err, size_t errlen);
    /* A document's cache right after it was read, filed by its content (doc_sha) and key (prefill
     * policy and prompt form), so every conversation about the same text starts from it. Either may
     * be NULL (the store keeps none); put needs the conversation about it stored first. */
    int (*get_doc_snapshot)(void *ud, const char *doc_sha, const char *key, void **data, size_t *len, char *err,
                            size_t errlen);
    int (*put_doc_snapshot)(void *ud, const char *doc_sha, const char *key, int64_t n_tokens, const void *data,
                            size_t len, char *err, size_t errlen);
} sess_persist;

void sess_messages_free(sess_message *m, int n);

/* ---- the object */

/* A conversation over r, which the session owns from now on (also when this fails: NULL with a
 * message). */
session *sess_create(run *r, const sess_config *cfg, char *err, size_t errlen);
void sess_free(session *s);
const char *sess_error(const session *s);
/* What loading did that a front end should say once, e.g. which weight types the GPU converts to
 * f16 ("" when nothing). */
const char *sess_load_note(const session *s);
/* A warning about the configuration ("" when none), e.g. a context above the model's training. */
const char *sess_warning(const session *s);

/* Where the session reports, and the flag that stops the running operation (checked before every
 * layer and token); both stay until changed. */
void sess_set_callbacks(session *s, const sess_callbacks *cb, volatile sig_atomic_t *abort_flag);
/* Save turns through db (NULL: nothing is saved). Registers the model (db->model). */
int sess_attach_store(session *s, const sess_persist *db);

/* Open a document as a new conversation (title NULL: the file's name; name: a unique name to find it
 * by, or NULL). The text is read and checked (document.h). With defer (1), nothing is evaluated now:
 * the document is prefilled together with the first question (whose tokens the prefill policies then
 * see), as `ask` does; with 0 it is prefilled now, with progress; with SESS_DEFER_PREFILL_POLICY the
 * former under a prefill policy (said in a note), the latter under full attention or a decode-time
 * policy (the interface). */
#define SESS_DEFER_PREFILL_POLICY (-1)
int sess_open_document(session *s, const char *path, const char *title, const char *name, int defer);
/* The next question and its answer; the turn is saved when a store is attached. */
int sess_ask(session *s, const char *question);
/* Another answer to the last question, saved as a branch beside the first. */
int sess_regenerate(session *s);
/* Ask question instead of question k (1 = the first) of this conversation, as a new branch from
 * where k was asked: from its recorded start when it was asked in this session object, else by
 * prefilling the document and the conversation before it again (from the store). */
int sess_branch(session *s, int k, const char *question);

/* Continue a stored conversation (key: its name or id, "" the most recent): the messages along
 * its newest branch go to the past callback, the cache comes from the snapshot after the last
 * answer under the current prefill policy or, without one, from the document and the conversation
 * prefilled again (now, or with the next question when defer). Options: */
typedef struct sess_resume_opts {
    int defer;                   /* prefill with the next question (ask) instead of now (the TUI) */
    int take_policy;             /* take the stored conversation's own policy: its last answer's (else
                                    the one it began with, and its budget) */
    int format;                  /* SESS_FORMAT_*: a format asked for (AUTO: the stored one) */
    const char *doc_path;        /* the document as given again (its content must match), or NULL */
} sess_resume_opts;
int sess_resume(session *s, const char *key, const sess_resume_opts *o);

/* Switch to spec with budget (NULL: the current budget). A decode-time change applies to the next
 * answer; a new prefill policy with a document loaded rebuilds the cache from the stored snapshot
 * of this point under it, else by prefilling again; on cancel or failure the old policies and cache
 * come back exactly. */
int sess_set_policy(session *s, const char *spec, const char *budget);
/* Would sess_set_policy accept spec with budget here? The checks every front end shares: the spec
 * parses, and its budgets fit this conversation (or, before a document, the context) and are not
 * below what each policy always keeps. A budget given (non-NULL) replaces the spec's own budget=. */
int sess_check_policy(session *s, const char *spec, const char *budget);
/* Trace what the policies decide about the tokens of text (its first place in the sequence) from the
 * next question on (kvchat ask --trace; NULL: none): that question fails when the text is not in the
 * sequence by then. sess_trace_text: the trace so far ("" when none) and the positions [lo, hi) it
 * follows (engine/policy/trace.h). */
int sess_trace(session *s, const char *text);
const char *sess_trace_text(const session *s, int64_t *lo, int64_t *hi);
/* Sampling settings and the answer length from the next answer on. */
void sess_set_sampling(session *s, const samp_params *sp, int64_t n_predict);

/* One answer of sess_compare. */
typedef struct sess_compared {
    char policy[256];
    char *text;                  /* malloc'd: the caller frees it */
    int64_t n_tokens;
    double seconds;              /* the answers' decoding, together (they are decoded in one batch) */
    double pages_per_step, kv_read_per_step;
    int events;
} sess_compared;
/* question answered under the current policy and each of specs (decode-time policies) from the
 * same cache, as a side query: the conversation goes on as before it. out gets the current policy's
 * answer and one per listed spec that differs from it (a spec naming the current policy is not run
 * twice); the answers are decoded together, one batched step for all (run_answer_batch), each from
 * a fork of the cache at the question's end. When cancelled each answer holds what it had; *n_out
 * says how many answers there are. */
int sess_compare(session *s, const char *const *specs, int n_specs, const char *question, sess_compared *out,
                 int *n_out);

/* "What the model sees": the sequence's text in spans of one state in the first global layer:
 * 0 evicted or merged away, 1 held, 2 attended at the last decode step. */
typedef struct sess_span {
    int state;
    char *text;
} sess_span;
int sess_seen(session *s, sess_span **out, int *n);
void sess_spans_free(sess_span *sp, int n);

/* ---- lower level: feeding tokens directly (bench, eval, calibrate, generate, logits) */

/* Evaluate ids at the end of the sequence (a prefill: the prefill policy runs); logits of the last
 * go to run_logits(sess_run(s)). each: every position's logits, or NULL. */
int sess_feed(session *s, const int32_t *ids, int64_t n, fwd_logits_fn each, void *ud);
/* Forget the sequence from pos on (replaying what sliding-window layers lost). */
int sess_rewind(session *s, int64_t pos);
/* Generate up to n_predict tokens after what was fed (its last token: prev), monitored, with
 * backtracking; the text goes to the text callback. */
int sess_generate(session *s, int64_t n_predict, gen_result *res);

/* ---- what the session holds, read-only for front ends */

typedef struct sess_answer {
    const char *text;            /* the last answer (as streamed) */
    const int32_t *ids;
    int64_t n_ids;
    gen_result gen;
    int64_t prompt_tokens;       /* evaluated for this turn */
    int64_t prompt_end;          /* the position the answer began at (the prompt's end) */
    double prefill_s, decode_s;
    int resumed;                 /* the cache came from a snapshot */
    double restore_ms;
    char saved[512];             /* where the turn was saved ("" when not saved) */
    int64_t user_msg, answer_msg;
    size_t snapshot_bytes;
    double save_ms;
} sess_answer;
const sess_answer *sess_last_answer(const session *s);

/* The runtime the conversation runs on: the model, the cache, the policies, the figures. */
const run *sess_run(const session *s);
int sess_backtrack(const session *s);
int sess_format(const session *s);                 /* SESS_FORMAT_CHAT or _PLAIN */
int64_t sess_turns(const session *s);              /* questions answered in this conversation */
int sess_have_document(const session *s);
const char *sess_document_title(const session *s);
const char *sess_title(const session *s);          /* the conversation's title */
int64_t sess_document_tokens(const session *s);
int64_t sess_stored_id(const session *s);          /* the stored conversation (0: none yet) */
const char *sess_budget(const session *s);
int64_t sess_n_predict(const session *s);
int64_t sess_answer_tokens(const session *s);      /* the answer being generated: its tokens so far */
/* 1 after a switch that rebuilt nothing (a decode-time policy, or before a document) until the next
 * answer, which is the first to use it. */
int sess_policy_pending(const session *s);
const char *sess_model_sha(const session *s);      /* "" when no store is attached */

/* The stop sequences an answer (answering 1) or a raw continuation (0) ends at: the plain form's
 * own (its next-turn marker, and the blank line or line break sess_config.answer_end asks for),
 * then the configured ones. Their count (at most max). */
int sess_stops(const session *s, int answering, const char **out, int max);

/* The prefill policy of a spec as snapshots are filed ("full" when there is none). */
void sess_prefill_key(const pol_spec *spec, char *buf, size_t cap);

#endif
