/* chat.c - chat templates (see chat.h): the turn formats Gemma, Llama 2, Mistral and Zephyr models were
 * trained on, rendered as text with their special markers. */
#include "engine/chat.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct strb {
    char *p;
    size_t n, cap;
    int oom;
} strb;

static void sb_add(strb *b, const char *s, size_t k)
{
    if (b->oom) return;
    if (b->n + k + 1 > b->cap) {
        size_t nc = (b->n + k + 1) * 2;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, k);
    b->n += k;
    b->p[b->n] = 0;
}

static void sb_cat(strb *b, const char *s) { sb_add(b, s, strlen(s)); }

/* Content with surrounding whitespace removed (the Gemma template trims). */
static void sb_trimmed(strb *b, const char *s)
{
    size_t n = strlen(s);
    while (n && isspace((unsigned char)*s)) {
        s++;
        n--;
    }
    while (n && isspace((unsigned char)s[n - 1])) n--;
    sb_add(b, s, n);
}

static int contains(gguf_str s, const char *needle)
{
    size_t k = strlen(needle);
    for (uint64_t i = 0; i + k <= s.len; i++)
        if (!memcmp(s.ptr + i, needle, k)) return 1;
    return 0;
}

enum chat_family chat_family_for(const gguf_file *f)
{
    gguf_str t;
    if (gguf_get_str(f, "tokenizer.chat_template", &t) == 0) {
        if (contains(t, "<start_of_turn>")) return CHAT_GEMMA;
        if (contains(t, "<<SYS>>")) return CHAT_LLAMA2;
        if (contains(t, "[INST]")) return CHAT_MISTRAL;
        if (contains(t, "<|user|>")) return CHAT_ZEPHYR;
    }
    gguf_str arch;
    if (gguf_get_str(f, "general.architecture", &arch) == 0 && gguf_str_eq(arch, "gemma3")) return CHAT_GEMMA;
    return CHAT_LLAMA2;
}

const char *chat_family_name(enum chat_family fam)
{
    switch (fam) {
    case CHAT_GEMMA: return "gemma";
    case CHAT_LLAMA2: return "llama2";
    case CHAT_MISTRAL: return "mistral";
    case CHAT_ZEPHYR: return "zephyr";
    }
    return "?";
}

static char *fail(char *err, size_t errlen, strb *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    free(b->p);
    return NULL;
}

char *chat_render(enum chat_family fam, const chat_msg *msgs, size_t n, int add_generation_prompt, char *err,
                  size_t errlen)
{
    strb b = { 0 };
    const char *system = NULL;
    size_t i0 = 0;
    if (n > 0 && !strcmp(msgs[0].role, "system")) {
        system = msgs[0].content;
        i0 = 1;
    }
    /* Turns must alternate user, assistant, user, ... */
    for (size_t i = i0; i < n; i++) {
        const char *want = (i - i0) % 2 == 0 ? "user" : "assistant";
        if (strcmp(msgs[i].role, want) != 0)
            return fail(err, errlen, &b, "chat message %zu has role '%s' where '%s' was expected (turns must alternate)",
                        i + 1, msgs[i].role, want);
    }
    switch (fam) {
    case CHAT_GEMMA:
        sb_cat(&b, "<bos>");
        for (size_t i = i0; i < n; i++) {
            int user = (i - i0) % 2 == 0;
            sb_cat(&b, user ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
            if (user && i == i0 && system) {
                sb_trimmed(&b, system);
                sb_cat(&b, "\n\n");
            }
            sb_trimmed(&b, msgs[i].content);
            sb_cat(&b, "<end_of_turn>\n");
        }
        if (add_generation_prompt) sb_cat(&b, "<start_of_turn>model\n");
        break;
    case CHAT_LLAMA2:
        for (size_t i = i0; i < n; i++) {
            if ((i - i0) % 2 == 0) {
                sb_cat(&b, "<s>[INST] ");
                if (i == i0 && system) {
                    sb_cat(&b, "<<SYS>>\n");
                    sb_cat(&b, system);
                    sb_cat(&b, "\n<</SYS>>\n\n");
                }
                sb_cat(&b, msgs[i].content);
                sb_cat(&b, " [/INST]");
            } else {
                sb_cat(&b, " ");
                sb_cat(&b, msgs[i].content);
                sb_cat(&b, " </s>");
            }
        }
        break;
    case CHAT_MISTRAL:
        sb_cat(&b, "<s>");
        for (size_t i = i0; i < n; i++) {
            if ((i - i0) % 2 == 0) {
                sb_cat(&b, "[INST] ");
                if (i == i0 && system) {
                    sb_cat(&b, system);
                    sb_cat(&b, "\n\n");
                }
                sb_cat(&b, msgs[i].content);
                sb_cat(&b, " [/INST]");
            } else {
                sb_cat(&b, msgs[i].content);
                sb_cat(&b, "</s>");
            }
        }
        break;
    case CHAT_ZEPHYR:
        sb_cat(&b, "<s>");
        if (system) {
            sb_cat(&b, "<|system|>\n");
            sb_cat(&b, system);
            sb_cat(&b, "</s>\n");
        }
        for (size_t i = i0; i < n; i++) {
            sb_cat(&b, (i - i0) % 2 == 0 ? "<|user|>\n" : "<|assistant|>\n");
            sb_cat(&b, msgs[i].content);
            sb_cat(&b, "</s>\n");
        }
        if (add_generation_prompt) sb_cat(&b, "<|assistant|>\n");
        break;
    }
    if (b.oom) return fail(err, errlen, &b, "out of memory");
    if (!b.p) sb_cat(&b, "");
    return b.p;
}

char *chat_continue(enum chat_family fam, const char *question)
{
    strb b = { 0 };
    switch (fam) {
    case CHAT_GEMMA:
        sb_cat(&b, "<end_of_turn>\n<start_of_turn>user\n");
        sb_trimmed(&b, question);
        sb_cat(&b, "<end_of_turn>\n<start_of_turn>model\n");
        break;
    case CHAT_LLAMA2:
        sb_cat(&b, " </s><s>[INST] ");
        sb_cat(&b, question);
        sb_cat(&b, " [/INST]");
        break;
    case CHAT_MISTRAL:
        sb_cat(&b, "</s>[INST] ");
        sb_cat(&b, question);
        sb_cat(&b, " [/INST]");
        break;
    case CHAT_ZEPHYR:
        sb_cat(&b, "</s>\n<|user|>\n");
        sb_cat(&b, question);
        sb_cat(&b, "</s>\n<|assistant|>\n");
        break;
    }
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
