/* persist.h - the store's implementation of the engine's persistence interface (sess_persist):
 * a session saves its turns, events and snapshots, and resumes, through these functions, so the
 * engine never includes sqlite. Also the Markdown export of a stored conversation. */
#ifndef KVCHAT_STORE_PERSIST_H
#define KVCHAT_STORE_PERSIST_H

#include <stdint.h>
#include <stdio.h>

#include "engine/session.h"
#include "store/store.h"

typedef struct store_persist {
    sess_persist ops;            /* what sess_attach_store takes; ops.ud points back here */
    store *db;
    int64_t model_id;            /* the model registered by ops.model */
    int hold;                    /* 1: hold the session found or created (store_hold), as the
                                    terminal interface does, so another kvchat does not fork it */
} store_persist;

/* Bind the interface to db (which must outlive it). Finding a session another live kvchat holds
 * is refused with a message naming it and that process. */
void store_persist_init(store_persist *p, store *db);

/* The conversation's newest branch as Markdown (title, model, document, policy, then each question
 * and answer). 0, or -1 with a message. */
int store_export_md(store *db, const store_session *ss, FILE *f, char *err, size_t errlen);

#endif
