/* prompt.h - the token ids of a conversation about a document.
 *
 * Two forms. The model's chat template, with the document and the first question in one user turn
 * (the template's text carries BOS and the turn markers); or, for a base model that was never
 * trained on turn markers, the plain completion
 *     DOCUMENT\n\nQuestion: Q1\nAnswer: A1\nQuestion: Q2\nAnswer:
 * Every front end builds its prompts here, so a conversation resumed by one continues exactly the
 * tokens another wrote. A plain-form answer ends at its first blank line (PROMPT_END_PARAGRAPH): a
 * base model writes on past its answer (more of the document, text it saw), and what it wrote stays
 * in the turns the next question sees; docs/eval.md measures the forms. */
#ifndef KVCHAT_PROMPT_H
#define KVCHAT_PROMPT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model.h"

/* Where a plain-form answer ends: at its first blank line (a paragraph: the default), at its first
 * line break (an answer that begins with one then comes out empty), or only where the model begins
 * its next "\nQuestion:" (the turn: kvchat's form before docs/eval.md's follow-up measurement). */
enum { PROMPT_END_PARAGRAPH = 0, PROMPT_END_LINE = 1, PROMPT_END_TURN = 2 };

/* The plain form's own stop sequences for an answer ending as answer_end says (PROMPT_END_*): the
 * next "\nQuestion:" always, and "\n" or "\n\n" for a line or a paragraph. How many went into out. */
int prompt_plain_stops(int answer_end, const char **out, int max);

/* 1 when the model file carries a chat template (the default form then). */
int prompt_has_template(const model *m);

/* The document, the turns (texts alternating user question and assistant answer, n_turns of them;
 * an odd last one is ignored) and question. chat: the template (1) or the plain form (0).
 * ids malloc'd. 0, or -1 with a message. */
int prompt_conversation(const model *m, int chat, const char *doc, const char *const *turns, int n_turns,
                        const char *question, int32_t **ids, size_t *n, char *err, size_t errlen);
/* The tokens that ask the next question after an answer (whose closing marker may be missing). */
int prompt_continue(const model *m, int chat, const char *question, int32_t **ids, size_t *n, char *err,
                    size_t errlen);

/* How many tokens the question takes at a prompt's end (prompt_continue's: the question with its
 * markers), what the task-aware prefill policies probe with (run_set_question); 0 on failure. */
int64_t prompt_question_tokens(const model *m, int chat, const char *question);

/* The document alone, the way its turn goes on with the first question (prompt_first_question):
 * prefilled before any question is asked. gemma: Gemma's turn markers, else the plain form. */
int prompt_document(const model *m, int gemma, const char *doc, int32_t **ids, size_t *n, char *err,
                    size_t errlen);
/* The first question after prompt_document (after_doc 1), or as a turn of its own (after_doc 0, the
 * sequence empty: BOS first). */
int prompt_first_question(const model *m, int gemma, int after_doc, const char *question, int32_t **ids, size_t *n,
                          char *err, size_t errlen);

#endif
