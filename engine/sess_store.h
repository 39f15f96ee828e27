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
/* The answered turn into the store: both messages (a regeneration: the answer only, beside the
 * first), the events, a snapshot. SESS_OK (also without a store) or SESS_ESAVE. */
int sess_save_turn(session *s, const char *question, int regen);
/* The key snapshots of the current policies are filed under. */
void sess_current_prefill_key(const session *s, char *buf, size_t cap);

#endif
