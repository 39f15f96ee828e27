/* chat.h - chat templates: render a conversation into the prompt text a model was trained on.
 *
 * Families: Gemma turns (<start_of_turn>user ... <end_of_turn>), Llama 2 [INST] with <<SYS>>,
 * Mistral [INST], and Zephyr-style (<|user|>) for TinyLlama chat. The family is chosen from
 * tokenizer.chat_template when the file has one, else from the architecture. The rendered text is
 * tokenized with parse_special on, so turn markers become their control ids. */
#ifndef KVCHAT_CHAT_H
#define KVCHAT_CHAT_H

#include <stddef.h>

#include "engine/gguf.h"

enum chat_family { CHAT_GEMMA, CHAT_LLAMA2, CHAT_MISTRAL, CHAT_ZEPHYR };

typedef struct chat_msg {
    const char *role;     /* "system", "user" or "assistant" */
    const char *content;
} chat_msg;

/* Pick the family for a model file (template text first, then general.architecture). */
enum chat_family chat_family_for(const gguf_file *f);
const char *chat_family_name(enum chat_family fam);

/* Render msgs (roles must alternate user/assistant after an optional system message) and, if
 * add_generation_prompt, the opening of the assistant turn. The text includes the BOS marker
 * ("<bos>" or "<s>") at the start, so encode it with add_bos = 0 and parse_special = 1.
 * Returns malloc'd text, or NULL with a message in err. */
char *chat_render(enum chat_family fam, const chat_msg *msgs, size_t n, int add_generation_prompt,
                  char *err, size_t errlen);

/* The text that follows an assistant answer to ask the next question: the answer's closing marker
 * (generation may have stopped before it), the user turn, and the opening of the next assistant
 * turn. Encode with add_bos = 0 and parse_special = 1. malloc'd, or NULL when out of memory. */
char *chat_continue(enum chat_family fam, const char *question);

#endif
