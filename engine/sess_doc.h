/* sess_doc.h - a session's document (private to the session's files; see sess_priv.h): reading it
 * with the fit check, starting a conversation over, and keeping the loaded one to go back to. */
#ifndef KVCHAT_SESS_DOC_H
#define KVCHAT_SESS_DOC_H

#include "engine/sess_priv.h"

/* The document at path, refused before it is read when its size alone proves it cannot fit (*code:
 * SESS_ENOFIT, else SESS_EFAIL with the message in s->err). */
char *sess_load_document(session *s, const char *path, size_t *len, int *code);
/* The same, refused (SESS_EMISMATCH) when its sha256 is not want_sha (it changed since the
 * conversation began). */
char *sess_reload_document(session *s, const char *path, const char *want_sha, size_t *len, int *code);
/* No conversation: the cache and sequence empty, the sampler fresh, no turns, nothing pending. */
void sess_reset_conversation(session *s);
/* The cache is empty again and no document is loaded (a rebuild that failed half way). */
void sess_drop_document(session *s);
/* The tokens of a turn in the Gemma form that puts the document in the first user turn. */
int sess_gemma_turns(const session *s);
void sess_clear_pending(session *s);
/* Under the prefill policy prefill_key, a document read before its first question waits for that
 * question instead (a prefill policy compresses with what the prompt's end asks in view, as in
 * `ask`): 1 when it waits. sess_note_waiting says so. */
int sess_prefill_waits_for_question(const char *prefill_key);
void sess_note_waiting(session *s, const char *prefill_key);

#endif
