/* sess_store.h - a session's persistence through sess_persist (private to the session's files;
 * see sess_priv.h): the stored conversation's row, turns and snapshots. */
#ifndef KVCHAT_SESS_STORE_H
#define KVCHAT_SESS_STORE_H

#include "engine/sess_priv.h"

/* The stored conversation's row, created when the first turn is saved (or a document prefilled);
 * nothing without a store or a document. SESS_OK or SESS_ESAVE. */
int sess_ensure_stored(session *s);
/* A snapshot of the sequence as it is, filed under message msg and the current prefill policy. 0,
 * or -1 with the message in s->err. */
int sess_save_snapshot(session *s, int64_t msg, size_t *len);
/* The question of the turn about to be answered, as a user message under the last answer, so that a
 * process killed mid-answer (kill -9) still keeps it; its id goes to s->last.user_msg (0 when not
 * saved, and then sess_save_turn saves it with the answer). SESS_OK (also without a store) or
 * SESS_ESAVE. */
int sess_save_question(session *s, const char *question);
/* The answered turn into the store: the question unless sess_save_question saved it (a regeneration:
 * the answer only, beside the first), the answer (its metrics say "interrupted": true when the abort
 * flag stopped it part way), the events, a snapshot. SESS_OK (also without a store) or SESS_ESAVE. */
int sess_save_turn(session *s, const char *question, int regen);
/* The key snapshots of the current policies are filed under. */
void sess_current_prefill_key(const session *s, char *buf, size_t cap);

#endif
