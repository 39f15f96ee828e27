/* prompt.c - a conversation's token ids in chat or plain form (see prompt.h). */
#include "engine/prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/chat.h"
#include "engine/tokenizer.h"

int prompt_plain_stops(int answer_end, const char **out, int max)
{
    int n = 0;
    if (n < max) out[n++] = "\nQuestion:";
    if (answer_end == PROMPT_END_LINE && n < max) out[n++] = "\n";
    if (answer_end == PROMPT_END_PARAGRAPH && n < max) out[n++] = "\n\n";
    return n;
}

int prompt_has_template(const model *m) { return gguf_find_key(m->gguf, "tokenizer.chat_template") >= 0; }

static int encode(const model *m, const char *text, int add_bos, int special, int32_t **ids, size_t *n, char *err,
                  size_t errlen)
{
    return tok_encode(m->vocab, text, strlen(text), add_bos, special, ids, n, err, errlen) ? -1 : 0;
}

static int oom(char *err, size_t errlen)
{
    snprintf(err, errlen, "out of memory");
    return -1;
}

int prompt_conversation(const model *m, int chat, const char *doc, const char *const *turns, int n_turns,
                        const char *question, int32_t **ids, size_t *n, char *err, size_t errlen)
{
    n_turns -= n_turns % 2;   /* a trailing unanswered question is not part of the conversation */
    int rc;
    if (chat) {
        chat_msg *msgs = calloc((size_t)n_turns + 1, sizeof *msgs);
        const char *q0 = n_turns ? turns[0] : question;
        size_t L = strlen(doc) + strlen(q0) + 3;
        char *first = malloc(L);
        if (!msgs || !first) {
            free(msgs);
            free(first);
            return oom(err, errlen);
        }
        snprintf(first, L, "%s\n\n%s", doc, q0);
        msgs[0] = (chat_msg){ "user", first };
        for (int i = 1; i < n_turns; i++) msgs[i] = (chat_msg){ i % 2 ? "assistant" : "user", turns[i] };
        if (n_turns) msgs[n_turns] = (chat_msg){ "user", question };
        char *r = chat_render(chat_family_for(m->gguf), msgs, (size_t)n_turns + 1, 1, err, errlen);
        free(msgs);
        free(first);
        if (!r) return -1;
        rc = encode(m, r, 0, 1, ids, n, err, errlen);
        free(r);
    } else {
        size_t L = strlen(doc) + strlen(question) + 64;
        for (int i = 0; i < n_turns; i++) L += strlen(turns[i]) + 32;
        char *t = malloc(L);
        if (!t) return oom(err, errlen);
        size_t o = (size_t)snprintf(t, L, "%s\n", doc);
        for (int i = 0; i < n_turns; i += 2)
            o += (size_t)snprintf(t + o, L - o, "\nQuestion: %s\nAnswer:%s", turns[i], turns[i + 1]);
        snprintf(t + o, L - o, "\nQuestion: %s\nAnswer:", question);
        rc = encode(m, t, tok_add_bos(m->vocab), 0, ids, n, err, errlen);
        free(t);
    }
    if (rc == 0 && *n == 0) {
        snprintf(err, errlen, "the prompt is empty");
        free(*ids);
        *ids = NULL;
        rc = -1;
    }
    return rc;
}

int prompt_continue(const model *m, int chat, const char *question, int32_t **ids, size_t *n, char *err,
                    size_t errlen)
{
    char *text;
    if (chat) {
        text = chat_continue(chat_family_for(m->gguf), question);
    } else {
        size_t L = strlen(question) + 32;
        if ((text = malloc(L))) snprintf(text, L, "\nQuestion: %s\nAnswer:", question);
    }
    if (!text) return oom(err, errlen);
    int rc = encode(m, text, 0, chat, ids, n, err, errlen);
    free(text);
    return rc;
}

int64_t prompt_question_tokens(const model *m, int chat, const char *question)
{
    int32_t *ids = NULL;
    size_t n = 0;
    char err[128];
    if (prompt_continue(m, chat, question, &ids, &n, err, sizeof err)) return 0;
    free(ids);
    return (int64_t)n;
}

int prompt_document(const model *m, int gemma, const char *doc, int32_t **ids, size_t *n, char *err, size_t errlen)
{
    size_t L = strlen(doc) + 64;
    char *t = malloc(L);
    if (!t) return oom(err, errlen);
    snprintf(t, L, gemma ? "<bos><start_of_turn>user\n%s\n\n" : "%s\n\n", doc);
    int rc = encode(m, t, gemma ? 0 : tok_add_bos(m->vocab), gemma, ids, n, err, errlen);
    free(t);
    return rc;
}

int prompt_first_question(const model *m, int gemma, int after_doc, const char *question, int32_t **ids, size_t *n,
                          char *err, size_t errlen)
{
    size_t L = strlen(question) + 64;
    char *t = malloc(L);
    if (!t) return oom(err, errlen);
    if (gemma)
        snprintf(t, L, after_doc ? "%s<end_of_turn>\n<start_of_turn>model\n"
                                 : "<bos><start_of_turn>user\n%s<end_of_turn>\n<start_of_turn>model\n",
                 question);
    else
        snprintf(t, L, "Question: %s\nAnswer:", question);
    int rc = encode(m, t, !after_doc && !gemma ? tok_add_bos(m->vocab) : 0, gemma, ids, n, err, errlen);
    free(t);
    return rc;
}
