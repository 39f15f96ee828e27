/* test_chat.c - chat templates render the exact turn formats, refuse non-alternating turns, are
 * chosen by architecture when the file has no template, and Gemma's rendering tokenizes to the
 * control ids (BOS 2, <start_of_turn> 105). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "gguf.h"
#include "tokenizer.h"

#define TD "../shared/testdata/"

static void expect_render(enum chat_family fam, const chat_msg *m, size_t n, int gen, const char *want)
{
    char err[256];
    char *got = chat_render(fam, m, n, gen, err, sizeof err);
    cr_assert(got, "%s", err);
    cr_expect_str_eq(got, want, "%s template", chat_family_name(fam));
    free(got);
}

Test(chat, gemma_turns)
{
    chat_msg one[] = { { "user", "  Hi there \n" } };
    expect_render(CHAT_GEMMA, one, 1, 1, "<bos><start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n");
    chat_msg conv[] = { { "system", "Be brief." }, { "user", "Hi" }, { "assistant", "Hello!" }, { "user", "Bye" } };
    expect_render(CHAT_GEMMA, conv, 4, 1,
                  "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
                  "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
}

Test(chat, llama2_inst_with_and_without_system)
{
    chat_msg one[] = { { "user", "Hi" } };
    expect_render(CHAT_LLAMA2, one, 1, 1, "<s>[INST] Hi [/INST]");
    chat_msg conv[] = { { "system", "Be brief." }, { "user", "Hi" }, { "assistant", "Hello!" }, { "user", "Bye" } };
    expect_render(CHAT_LLAMA2, conv, 4, 1,
                  "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Bye [/INST]");
}

Test(chat, mistral_and_zephyr)
{
    chat_msg conv[] = { { "system", "Sys" }, { "user", "Hi" }, { "assistant", "Yo" }, { "user", "Bye" } };
    expect_render(CHAT_MISTRAL, conv, 4, 1, "<s>[INST] Sys\n\nHi [/INST]Yo</s>[INST] Bye [/INST]");
    expect_render(CHAT_ZEPHYR, conv, 4, 1,
                  "<s><|system|>\nSys</s>\n<|user|>\nHi</s>\n<|assistant|>\nYo</s>\n<|user|>\nBye</s>\n<|assistant|>\n");
    chat_msg one[] = { { "user", "Hi" } };
    expect_render(CHAT_ZEPHYR, one, 1, 0, "<s><|user|>\nHi</s>\n");
}

Test(chat, turns_must_alternate)
{
    chat_msg bad[] = { { "user", "a" }, { "user", "b" } };
    char err[256];
    cr_expect_null(chat_render(CHAT_GEMMA, bad, 2, 1, err, sizeof err));
    cr_expect(strstr(err, "alternate"), "%s", err);
    chat_msg bad2[] = { { "assistant", "a" } };
    cr_expect_null(chat_render(CHAT_LLAMA2, bad2, 1, 1, err, sizeof err));
}

Test(chat, family_from_architecture)
{
    gguf_file *f;
    char err[256];
    cr_assert(gguf_open(&f, TD "tiny/tiny-gemma3-f16.gguf", err, sizeof err) == 0);
    cr_expect_eq(chat_family_for(f), CHAT_GEMMA);
    gguf_free(f);
    cr_assert(gguf_open(&f, TD "tiny/tiny-llama-f16.gguf", err, sizeof err) == 0);
    cr_expect_eq(chat_family_for(f), CHAT_LLAMA2);
    /* the Llama vocabulary has <s> as a control token: the rendering starts with BOS */
    tok_vocab *v;
    cr_assert(tok_create(&v, f, NULL, err, sizeof err) == 0, "%s", err);
    chat_msg one[] = { { "user", "Hi" } };
    char *text = chat_render(CHAT_LLAMA2, one, 1, 1, err, sizeof err);
    int32_t *ids;
    size_t n;
    cr_assert(tok_encode(v, text, strlen(text), 0, 1, &ids, &n, err, sizeof err) == 0, "%s", err);
    cr_expect(n > 2 && ids[0] == 1);
    free(ids);
    free(text);
    tok_free(v);
    gguf_free(f);
}

Test(chat, gemma_rendering_tokenizes_to_control_ids)
{
    char path[512];
    const char *home = getenv("HOME");
    snprintf(path, sizeof path, "%s/.cache/kvchat/models/gemma-3-270m-q4_k_m.gguf", home ? home : "");
    FILE *chk = fopen(path, "rb");
    if (!chk) cr_skip_test("default model not present");
    fclose(chk);
    gguf_file *f;
    tok_vocab *v;
    char err[512];
    cr_assert(gguf_open(&f, path, err, sizeof err) == 0, "%s", err);
    cr_assert(tok_create(&v, f, NULL, err, sizeof err) == 0, "%s", err);
    chat_msg one[] = { { "user", "Hi" } };
    char *text = chat_render(chat_family_for(f), one, 1, 1, err, sizeof err);
    int32_t *ids;
    size_t n;
    cr_assert(tok_encode(v, text, strlen(text), 0, 1, &ids, &n, err, sizeof err) == 0, "%s", err);
    cr_assert_geq(n, 8u);
    cr_expect_eq(ids[0], 2);
    cr_expect_eq(ids[1], 105);
    cr_expect_eq(ids[n - 1], 107, "ends with the newline after 'model'");
    int ends = 0;
    for (size_t i = 0; i < n; i++) ends += ids[i] == 106;
    cr_expect_eq(ends, 1);
    free(ids);
    free(text);
    tok_free(v);
    gguf_free(f);
}
