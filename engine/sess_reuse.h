/* sess_reuse.h - text a conversation has read once is not read again (private to the session's
 * files; see sess_priv.h): a document's cache right after it was read, filed by content so any
 * conversation about the same text starts from it, and the longest stored state of a conversation
 * under a prefill policy that the sequence begins with, restored so only what follows it is read. */
#ifndef KVCHAT_SESS_REUSE_H
#define KVCHAT_SESS_REUSE_H

#include "engine/sess_store.h"

/* The document snapshot's key: the current prefill policy and the prompt form (a document's tokens
 * differ between the chat template and the plain form). */
void sess_doc_snapshot_key(const session *s, char *buf, size_t cap);
/* The cache as it is (the document alone, just read) filed as the document's snapshot; a failure
 * is said in a note and changes nothing else. */
void sess_save_doc_snapshot(session *s);
/* The document's snapshot restored when its tokens are exactly ids[0..n) (1: none, or not usable:
 * the run is then empty; 0: restored, *ms how long it took). */
int sess_restore_doc_snapshot(session *s, const int32_t *ids, int64_t n, double *ms);
/* What sess_rebuild_from_stored restored. */
typedef struct sess_rebuilt {
    int64_t from;                /* the tokens the stored state held (the rest was read) */
    size_t bytes;                /* its snapshot's size (0: the document's snapshot) */
    int answer;                  /* the answer it was saved after (0: the document's snapshot) */
    int at_leaf;                 /* it is the snapshot after leaf itself */
} sess_rebuilt;
/* The sequence want[0..n_want), of which the first pos were in the cache, rebuilt under the current
 * policies from the longest stored state that begins it: the snapshot after an answer on the path
 * to message leaf (newest first: leaf's own first), else the document's; only the tokens after it
 * are evaluated, up to pos (the rest wait, as they did). A snapshot that cannot be read or used is
 * said in a note and passed over. 0 done, 1 no usable state (the run is empty), else a failure (the
 * run is empty) with the message in s->err. */
int sess_rebuild_from_stored(session *s, int64_t leaf, const int32_t *want, int64_t n_want, int64_t pos,
                             sess_rebuilt *rb);

#endif
