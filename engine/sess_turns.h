/* sess_turns.h - a session's turns (private to the session's files; see sess_priv.h): a question's
 * tokens evaluated, the answer generated into the session's answer text, the turn recorded. */
#ifndef KVCHAT_SESS_TURNS_H
#define KVCHAT_SESS_TURNS_H

#include "engine/sess_priv.h"

/* The next turn's tokens join the sequence and what the cache lacks (the last answer's final token,
 * sampled but never evaluated, then the turn) is evaluated; *n_eval and *secs say how much and how
 * long. The turn's start is recorded for sess_branch (s->pending_record). */
int sess_prepare_turn(session *s, const char *question, int64_t *n_eval, double *secs);
/* Generate after the evaluated prompt: the text through the callbacks and into s->answer. keep: the
 * answer joins the sequence (0: a side query); answering: a turn of the conversation (the format's
 * next-turn marker stops it), not a raw continuation. */
int sess_generate_into(session *s, int64_t n_predict, int max_regen, int keep, int answering, gen_result *gr);
void sess_answer_reset(session *s);

#endif
