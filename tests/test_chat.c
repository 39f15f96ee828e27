/* test_chat.c - chat templates (engine/chat.h): the exact text each family renders with and without a
 * system message, single and multi-turn, with and without the generation prompt; refusal of turns that
 * do not alternate; the family chosen for the tiny model files; and the rendered prompts tokenizing to
 * the control ids (Gemma 3: <bos> 2, <start_of_turn> 105; Llama: <s> 1, </s> 2).
 * Run with cwd = repo root: test data is read from ../shared/testdata/. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/chat.h"
#include "engine/gguf.h"
#include "engine/tokenizer.h"

#define TD "../shared/testdata/"
#define NMSG(a) (sizeof(a) / sizeof((a)[0]))

static void expect_render(enum chat_family fam, const chat_msg *m, size_t n, int gen, const char *want)
{
    char err[256] = "";
    char *got = chat_render(fam, m, n, gen, err, sizeof err);
    cr_assert(got, "%s: chat_render failed: %s", chat_family_name(fam), err);
    cr_expect_str_eq(got, want, "%s template, %zu messages, generation prompt %d", chat_family_name(fam), n, gen);
    free(got);
}

/* The conversations every family is rendered with. */
static const chat_msg ONE[] = { { "user", "Hi" } };
static const chat_msg SYS_ONE[] = { { "system", "Be brief." }, { "user", "Hi" } };
static const chat_msg MULTI[] = { { "user", "Hi" }, { "assistant", "Hello!" }, { "user", "Bye" } };
static const chat_msg SYS_MULTI[] = { { "system", "Be brief." }, { "user", "Hi" }, { "assistant", "Hello!" },
                                      { "user", "Bye" } };

Test(chat, gemma_renders_turns_with_system_folded_into_the_first_user_turn)
{
    expect_render(CHAT_GEMMA, ONE, NMSG(ONE), 1, "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
    expect_render(CHAT_GEMMA, ONE, NMSG(ONE), 0, "<bos><start_of_turn>user\nHi<end_of_turn>\n");
    expect_render(CHAT_GEMMA, SYS_ONE, NMSG(SYS_ONE), 1,
                  "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n");
    expect_render(CHAT_GEMMA, MULTI, NMSG(MULTI), 1,
                  "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
                  "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
    expect_render(CHAT_GEMMA, SYS_MULTI, NMSG(SYS_MULTI), 1,
                  "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
                  "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
}

Test(chat, gemma_strips_whitespace_around_message_content)
{
    chat_msg m[] = { { "user", "  \tHi there \n" }, { "assistant", "\nYes.  " }, { "user", "ok" } };
    expect_render(CHAT_GEMMA, m, NMSG(m), 1,
                  "<bos><start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\nYes.<end_of_turn>\n"
                  "<start_of_turn>user\nok<end_of_turn>\n<start_of_turn>model\n");
}

Test(chat, llama2_wraps_user_turns_in_inst_with_sys_block_and_eos_bos_between_turns)
{
    expect_render(CHAT_LLAMA2, ONE, NMSG(ONE), 1, "<s>[INST] Hi [/INST]");
    expect_render(CHAT_LLAMA2, SYS_ONE, NMSG(SYS_ONE), 1, "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]");
    expect_render(CHAT_LLAMA2, MULTI, NMSG(MULTI), 1, "<s>[INST] Hi [/INST] Hello! </s><s>[INST] Bye [/INST]");
    expect_render(CHAT_LLAMA2, SYS_MULTI, NMSG(SYS_MULTI), 1,
                  "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Bye [/INST]");
    /* a conversation ending with the answer closes it with </s> */
    expect_render(CHAT_LLAMA2, SYS_MULTI, 3, 0, "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s>");
}

Test(chat, mistral_puts_bos_once_and_system_inside_the_first_inst)
{
    expect_render(CHAT_MISTRAL, ONE, NMSG(ONE), 1, "<s>[INST] Hi [/INST]");
    expect_render(CHAT_MISTRAL, SYS_ONE, NMSG(SYS_ONE), 1, "<s>[INST] Be brief.\n\nHi [/INST]");
    expect_render(CHAT_MISTRAL, MULTI, NMSG(MULTI), 1, "<s>[INST] Hi [/INST]Hello!</s>[INST] Bye [/INST]");
    expect_render(CHAT_MISTRAL, SYS_MULTI, NMSG(SYS_MULTI), 1,
                  "<s>[INST] Be brief.\n\nHi [/INST]Hello!</s>[INST] Bye [/INST]");
}

Test(chat, zephyr_uses_role_tags_closed_by_eos)
{
    expect_render(CHAT_ZEPHYR, ONE, NMSG(ONE), 1, "<s><|user|>\nHi</s>\n<|assistant|>\n");
    expect_render(CHAT_ZEPHYR, ONE, NMSG(ONE), 0, "<s><|user|>\nHi</s>\n");
    expect_render(CHAT_ZEPHYR, SYS_ONE, NMSG(SYS_ONE), 1, "<s><|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\n");
    expect_render(CHAT_ZEPHYR, MULTI, NMSG(MULTI), 1,
                  "<s><|user|>\nHi</s>\n<|assistant|>\nHello!</s>\n<|user|>\nBye</s>\n<|assistant|>\n");
    expect_render(CHAT_ZEPHYR, SYS_MULTI, NMSG(SYS_MULTI), 1,
                  "<s><|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\nHello!</s>\n<|user|>\nBye</s>\n"
                  "<|assistant|>\n");
}

Test(chat, turns_that_do_not_alternate_are_refused_with_a_message)
{
    const enum chat_family fams[] = { CHAT_GEMMA, CHAT_LLAMA2, CHAT_MISTRAL, CHAT_ZEPHYR };
    const chat_msg two_users[] = { { "user", "a" }, { "user", "b" } };
    const chat_msg assistant_first[] = { { "assistant", "a" }, { "user", "b" } };
    const chat_msg late_system[] = { { "user", "a" }, { "system", "b" } };
    const chat_msg two_answers[] = { { "system", "s" }, { "user", "a" }, { "assistant", "b" }, { "assistant", "c" } };
    const struct { const chat_msg *m; size_t n; } bad[] = {
        { two_users, 2 }, { assistant_first, 2 }, { late_system, 2 }, { two_answers, 4 } };
    for (size_t f = 0; f < NMSG(fams); f++)
        for (size_t b = 0; b < NMSG(bad); b++) {
            char err[256] = "";
            char *r = chat_render(fams[f], bad[b].m, bad[b].n, 1, err, sizeof err);
            cr_expect_null(r, "%s: case %zu accepted: \"%s\"", chat_family_name(fams[f]), b, r ? r : "");
            free(r);
            cr_expect(strstr(err, "alternate"), "%s: case %zu: message \"%s\"", chat_family_name(fams[f]), b, err);
        }
    char err[256] = "";
    cr_expect_null(chat_render(CHAT_GEMMA, two_users, 2, 1, err, sizeof err));
    cr_expect(strstr(err, "message 2") && strstr(err, "'user'"), "the message names the culprit: \"%s\"", err);
}

Test(chat, family_names)
{
    cr_expect_str_eq(chat_family_name(CHAT_GEMMA), "gemma");
    cr_expect_str_eq(chat_family_name(CHAT_LLAMA2), "llama2");
    cr_expect_str_eq(chat_family_name(CHAT_MISTRAL), "mistral");
    cr_expect_str_eq(chat_family_name(CHAT_ZEPHYR), "zephyr");
}

/* The tiny files carry no chat template: the family follows general.architecture. The Llama
 * rendering tokenizes its <s> / </s> markers to BOS / EOS ids. */
Test(chat, tiny_gemma3_file_is_gemma_and_tiny_llama_file_is_llama2)
{
    gguf_file *f;
    char err[512];
    cr_assert(gguf_open(&f, TD "tiny/tiny-gemma3-q4_k_m.gguf", err, sizeof err) == 0, "%s", err);
    cr_expect_eq(chat_family_for(f), CHAT_GEMMA, "tiny gemma3: %s", chat_family_name(chat_family_for(f)));
    gguf_free(f);
    cr_assert(gguf_open(&f, TD "tiny/tiny-llama-q4_k_m.gguf", err, sizeof err) == 0, "%s", err);
    enum chat_family fam = chat_family_for(f);
    cr_expect_eq(fam, CHAT_LLAMA2, "tiny llama: %s", chat_family_name(fam));
    tok_vocab *v;
    cr_assert(tok_create(&v, f, NULL, err, sizeof err) == 0, "%s", err);
    char *text = chat_render(fam, MULTI, NMSG(MULTI), 1, err, sizeof err);
    cr_assert(text, "%s", err);
    int32_t *ids;
    size_t n;
    cr_assert(tok_encode(v, text, strlen(text), 0, 1, &ids, &n, err, sizeof err) == 0, "%s", err);
    cr_assert_gt(n, 4u);
    cr_expect_eq(ids[0], 1, "starts with BOS");
    int bos = 0, eos = 0, eos_then_bos = 0;
    for (size_t i = 0; i < n; i++) {
        bos += ids[i] == 1;
        eos += ids[i] == 2;
        if (i + 1 < n && ids[i] == 2 && ids[i + 1] == 1) eos_then_bos++;
    }
    cr_expect(bos == 2 && eos == 1 && eos_then_bos == 1, "BOS x%d, EOS x%d", bos, eos);
    free(ids);
    free(text);
    tok_free(v);
    gguf_free(f);
}

static int default_model(char *buf, size_t cap)
{
    const char *cache = getenv("KVCHAT_CACHE"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (cache && *cache) snprintf(buf, cap, "%s/models/gemma-3-270m-q4_k_m.gguf", cache);
    else if (xdg && *xdg) snprintf(buf, cap, "%s/kvchat/models/gemma-3-270m-q4_k_m.gguf", xdg);
    else snprintf(buf, cap, "%s/.cache/kvchat/models/gemma-3-270m-q4_k_m.gguf", home ? home : ".");
    return access(buf, R_OK) == 0;
}

/* On the default model the Gemma rendering, encoded with parse_special on and add_bos off, is
 * [<bos> 2, <start_of_turn> 105, user..., "\n" 107, ..., <end_of_turn> 106, "\n" 107, 105, model..., 107]. */
Test(chat, gemma_rendering_on_the_default_model_starts_with_bos_and_start_of_turn_ids)
{
    char path[1024];
    if (!default_model(path, sizeof path)) cr_skip_test("default model not present at %s", path);
    gguf_file *f;
    tok_vocab *v;
    char err[512];
    cr_assert(gguf_open(&f, path, err, sizeof err) == 0, "%s", err);
    cr_expect_eq(chat_family_for(f), CHAT_GEMMA);
    cr_assert(tok_create(&v, f, NULL, err, sizeof err) == 0, "%s", err);
    char *text = chat_render(CHAT_GEMMA, SYS_ONE, NMSG(SYS_ONE), 1, err, sizeof err);
    cr_assert(text, "%s", err);
    int32_t *ids;
    size_t n;
    cr_assert(tok_encode(v, text, strlen(text), 0, 1, &ids, &n, err, sizeof err) == 0, "%s", err);
    cr_assert_geq(n, 8u);
    cr_expect_eq(ids[0], 2, "<bos>");
    cr_expect_eq(ids[1], 105, "<start_of_turn>");
    cr_expect_eq(ids[n - 1], 107, "ends with the newline after 'model'");
    cr_expect_eq(ids[n - 3], 105, "the generation prompt opens a turn");
    int bos = 0, sot = 0, eot = 0;
    for (size_t i = 0; i < n; i++) {
        bos += ids[i] == 2;
        sot += ids[i] == 105;
        eot += ids[i] == 106;
    }
    cr_expect(bos == 1 && sot == 2 && eot == 1, "<bos> x%d, <start_of_turn> x%d, <end_of_turn> x%d", bos, sot, eot);
    char *back = tok_decode(v, ids, n);
    cr_expect_str_eq(back, "user\nBe brief.\n\nHi\nmodel\n", "control markers print nothing");
    free(back);
    free(ids);
    free(text);
    tok_free(v);
    gguf_free(f);
}
