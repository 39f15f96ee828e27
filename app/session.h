/* session.h - what a command needs to keep a conversation in the store: the database, the model's
 * and document's identities, the prompt of the next turn (a continuation after a restored snapshot,
 * or the whole conversation when there is none), and the key snapshots are filed under. */
#ifndef KVCHAT_SESSION_H
#define KVCHAT_SESSION_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "app/cli.h"
#include "store/store.h"

/* --db PATH, else the default location. NULL after printing a one-line error. */
store *sess_db_open(const char *path);
/* The model's row (its sha256 cached by path, size and modification time). 0, or -1 after printing. */
int sess_model(store *db, const char *model_path, const model *m, int64_t *id, char sha[65]);
/* The document's row (sha256 of its text, title from the file name). 0, or -1 after printing. */
int sess_document(store *db, int64_t model_id, const char *path, const char *text, size_t len, int64_t n_tokens,
                  int64_t *id);
/* The prefill policy of a spec, as snapshots are filed ("full" when there is none). */
void sess_prefill_key(const pol_spec *spec, char *buf, size_t cap);
/* The tokens that ask the next question after a restored sequence (whose last answer may lack its
 * closing marker). 0, or -1 with a message. */
int sess_continue_tokens(const cli_runtime *rt, int chat, const char *question, int32_t **ids, size_t *n, char *err,
                         size_t errlen);
/* The tokens of the whole conversation: the document with the first question, the answers and
 * questions along path, then question (when there is no snapshot to continue from). */
int sess_full_tokens(const cli_runtime *rt, int chat, const char *doc, const store_message *path, int n_path,
                     const char *question, int32_t **ids, size_t *n, char *err, size_t errlen);

/* The session's newest branch as Markdown (title, model, document, policy, then each question and
 * answer). 0, or -1 with a message. */
int sess_export_md(store *db, const store_session *ss, FILE *f, char *err, size_t errlen);

#endif
