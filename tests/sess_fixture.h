/* sess_fixture.h - what the session tests share (tests/test_session.c, tests/test_sess_reuse.c): a
 * temporary folder with a real sqlite store and the long test prompt as a document, and a session
 * on the tiny Gemma model (sliding window 32) over it. */
#ifndef KVCHAT_TESTS_SESS_FIXTURE_H
#define KVCHAT_TESTS_SESS_FIXTURE_H

#include <stdint.h>

#include "engine/session.h"
#include "store/persist.h"
#include "store/store.h"

#define SESS_FIXTURE_TD "../shared/testdata/"

typedef struct sess_fixture {
    char dir[64], db_path[128], doc[128];
    store *db;
    store_persist sp;
} sess_fixture;

/* dir made, doc.txt in it (prompts/p2.txt: about 850 tokens, many sliding windows long), s.db
 * opened; sess_fixture_close removes it all. */
void sess_fixture_open(sess_fixture *x);
void sess_fixture_close(sess_fixture *x);
void sess_fixture_copy(const char *from, const char *to);
/* A session on the tiny Gemma model: greedy, no backtracking, pages of 8, 4096 tokens of context,
 * the policy spec given; stop: a stop sequence (NULL: none); n_predict tokens at most; saving
 * through sp (NULL: nothing saved). */
session *sess_fixture_session(const char *spec, const store_persist *sp, const char *stop, int64_t n_predict);
/* sess_ask, asserted to succeed. */
void sess_fixture_ask(session *s, const char *q);

#endif
