/* test_tokenizer.c - SentencePiece tokenization of GGUF vocabularies: the 46 reference strings of the
 * Llama vocabulary, the prompt ids of every tiny-model reference file, Gemma's special tokens, special
 * parsing on and off, invalid UTF-8, and streaming decode that never emits half a character. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gguf.h"
#include "tokenizer.h"

#define TD "../shared/testdata/"

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)sz + 1);
    cr_assert_eq(fread(b, 1, (size_t)sz, f), (size_t)sz);
    b[sz] = 0;
    fclose(f);
    *n = (size_t)sz;
    return b;
}

typedef struct vocab_fixture {
    gguf_file *f;
    tok_vocab *v;
} vocab_fixture;

static vocab_fixture open_vocab(const char *path)
{
    vocab_fixture x;
    char err[512];
    cr_assert(gguf_open(&x.f, path, err, sizeof err) == 0, "%s", err);
    cr_assert(tok_create(&x.v, x.f, NULL, err, sizeof err) == 0, "%s", err);
    return x;
}

static void close_vocab(vocab_fixture x)
{
    tok_free(x.v);
    gguf_free(x.f);
}

Test(tokenizer, llama_vocab_matches_all_reference_strings)
{
    vocab_fixture x = open_vocab(TD "vocab/llama-spm.gguf");
    size_t ni, no;
    char *inp = slurp(TD "vocab/llama-spm.inp", &ni), *out = slurp(TD "vocab/llama-spm.out", &no);
    const char *sep = "\n__ggml_vocab_test__\n";
    char *s = inp, *line = out;
    int cases = 0;
    for (;;) {
        char *e = strstr(s, sep);
        if (!e) break;
        *e = 0;
        char *nl = strchr(line, '\n');
        cr_assert(nl, "fewer expected lines than strings");
        *nl = 0;
        int32_t want[512];
        int nw = 0;
        for (char *p = line; *p;) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p) break;
            want[nw++] = (int32_t)v;
            p = end;
        }
        int32_t *ids;
        size_t n;
        char err[256];
        cr_assert(tok_encode(x.v, s, strlen(s), 0, 0, &ids, &n, err, sizeof err) == 0, "%s", err);
        cr_expect_eq((int)n, nw, "case %d '%s': %zu ids, expected %d", cases, s, n, nw);
        for (int i = 0; i < nw && i < (int)n; i++)
            cr_expect_eq(ids[i], want[i], "case %d '%s': id %d is %d, expected %d", cases, s, i, ids[i], want[i]);
        char *back = tok_decode(x.v, ids, n);
        cr_expect_str_eq(back, s, "case %d: decode(encode(s)) != s", cases);
        free(back);
        free(ids);
        cases++;
        s = e + strlen(sep);
        line = nl + 1;
    }
    cr_expect_eq(cases, 46);
    free(inp);
    free(out);
    close_vocab(x);
}

static void check_ref_ids(const char *model, const char *prompt)
{
    char p[256];
    snprintf(p, sizeof p, TD "tiny/%s.gguf", model);
    vocab_fixture x = open_vocab(p);
    snprintf(p, sizeof p, TD "prompts/%s.txt", prompt);
    size_t tl;
    char *text = slurp(p, &tl);
    snprintf(p, sizeof p, TD "tiny/ref/%s.%s.txt", model, prompt);
    size_t rl;
    char *ref = slurp(p, &rl);
    char *ids_line = strstr(ref, "\nids ");
    cr_assert(ids_line);
    int32_t *ids;
    size_t n;
    char err[256];
    cr_assert(tok_encode(x.v, text, tl, 1, 0, &ids, &n, err, sizeof err) == 0, "%s", err);
    char *q = ids_line + 5;
    size_t i = 0;
    while (*q && *q != '\n') {
        char *end;
        long v = strtol(q, &end, 10);
        if (end == q) break;
        cr_assert(i < n, "%s/%s: fewer ids than the reference", model, prompt);
        cr_expect_eq(ids[i], (int32_t)v, "%s/%s: id %zu is %d, reference %ld", model, prompt, i, ids[i], v);
        i++;
        q = end;
    }
    cr_expect_eq(i, n, "%s/%s: %zu ids, reference %zu", model, prompt, n, i);
    free(ids);
    free(text);
    free(ref);
    close_vocab(x);
}

Test(tokenizer, prompt_ids_match_every_reference_file)
{
    const char *models[] = { "tiny-llama-f16", "tiny-llama-q4_k_m", "tiny-gemma3-f16", "tiny-gemma3-q4_k_m" };
    const char *prompts[] = { "p1", "p2", "p3" };
    for (int m = 0; m < 4; m++)
        for (int p = 0; p < 3; p++) check_ref_ids(models[m], prompts[p]);
}

Test(tokenizer, special_tokens_only_with_parse_special)
{
    vocab_fixture x = open_vocab(TD "vocab/llama-spm.gguf");
    int32_t *ids;
    size_t n;
    char err[256];
    cr_assert(tok_encode(x.v, "<s>Hi</s>", 9, 0, 1, &ids, &n, err, sizeof err) == 0, "%s", err);
    cr_assert_geq(n, 3u);
    cr_expect_eq(ids[0], 1);
    cr_expect_eq(ids[n - 1], 2);
    free(ids);
    cr_assert(tok_encode(x.v, "<s>Hi</s>", 9, 0, 0, &ids, &n, err, sizeof err) == 0, "%s", err);
    for (size_t i = 0; i < n; i++) cr_expect(ids[i] != 1 && ids[i] != 2, "markers must be spelled as text");
    free(ids);
    close_vocab(x);
}

Test(tokenizer, invalid_utf8_and_empty_text)
{
    vocab_fixture x = open_vocab(TD "vocab/llama-spm.gguf");
    int32_t *ids;
    size_t n;
    char err[256];
    cr_expect_eq(tok_encode(x.v, "a\xc3\x28", 3, 0, 0, &ids, &n, err, sizeof err), -1);
    cr_expect(strstr(err, "invalid UTF-8 at byte 1"), "%s", err);
    cr_expect_eq(tok_utf8_invalid_at("\xed\xa0\x80", 3), 0, "surrogates are invalid");
    cr_expect_eq(tok_utf8_invalid_at("\xc0\xaf", 2), 0, "overlong forms are invalid");
    cr_expect_eq(tok_utf8_invalid_at("ok \xf0\x9f\x99\x82", 7), -1);
    cr_assert(tok_encode(x.v, "", 0, 0, 0, &ids, &n, err, sizeof err) == 0);
    cr_expect_eq(n, 0u);
    free(ids);
    cr_assert(tok_encode(x.v, "", 0, 1, 0, &ids, &n, err, sizeof err) == 0);
    cr_expect(n == 1 && ids[0] == 1);
    free(ids);
    close_vocab(x);
}

Test(tokenizer, piece_text_of_bytes_and_controls)
{
    vocab_fixture x = open_vocab(TD "vocab/llama-spm.gguf");
    char buf[64];
    int32_t a = tok_find(x.v, "<0x41>");
    cr_assert(a >= 0);
    cr_expect_eq(tok_type_of(x.v, a), TOK_BYTE);
    cr_expect(tok_piece_text(x.v, a, 0, buf, sizeof buf) == 1 && buf[0] == 'A');
    cr_expect_eq(tok_piece_text(x.v, 1, 0, buf, sizeof buf), 0u, "BOS prints nothing");
    cr_expect_eq(tok_piece_text(x.v, 1, 1, buf, sizeof buf), 3u, "unless specials are rendered");
    cr_expect_eq(tok_piece_text(x.v, 450, 0, buf, sizeof buf), 4u);
    cr_expect(!memcmp(buf, " The", 4), "U+2581 becomes a space");
    close_vocab(x);
}

/* Text outside the vocabulary falls back to byte pieces; streaming must only ever emit whole
 * characters, and all the pieces together give the text back. */
Test(tokenizer, streaming_decode_never_splits_a_character)
{
    vocab_fixture x = open_vocab(TD "vocab/llama-spm.gguf");
    const char *text = "h\xc3\xa9llo \xf0\x9f\xa6\x99 \xe4\xb8\x96\xe7\x95\x8c \xe1\x9e\x80\xe1\x9e\x81 \xf0\x9f\x99\x82!";
    int32_t *ids;
    size_t n;
    char err[256];
    cr_assert(tok_encode(x.v, text, strlen(text), 1, 0, &ids, &n, err, sizeof err) == 0, "%s", err);
    int bytes = 0;
    for (size_t i = 0; i < n; i++) bytes += tok_type_of(x.v, ids[i]) == TOK_BYTE;
    cr_assert_gt(bytes, 4, "the text should need byte-fallback pieces");
    tok_stream st;
    tok_stream_init(&st, x.v);
    char all[512] = "", chunk[128];
    for (size_t i = 0; i < n; i++) {
        size_t w = tok_stream_feed(&st, ids[i], chunk, sizeof chunk);
        cr_expect_eq(tok_utf8_invalid_at(chunk, w), -1, "step %zu emitted a partial character", i);
        strncat(all, chunk, sizeof all - strlen(all) - 1);
    }
    size_t w = tok_stream_flush(&st, chunk, sizeof chunk);
    cr_expect_eq(w, 0u);
    cr_expect_str_eq(all, text);
    char *dec = tok_decode(x.v, ids, n);
    cr_expect_str_eq(dec, text);
    free(dec);
    free(ids);
    /* A lone continuation byte and a cut sequence become U+FFFD, never invalid output. */
    int32_t bad[3] = { tok_find(x.v, "<0x80>"), tok_find(x.v, "<0xE4>"), tok_find(x.v, "<0xB8>") };
    tok_stream_init(&st, x.v);
    w = tok_stream_feed(&st, bad[0], chunk, sizeof chunk);
    cr_expect(w == 3 && !memcmp(chunk, "\xef\xbf\xbd", 3));
    cr_expect_eq(tok_stream_feed(&st, bad[1], chunk, sizeof chunk), 0u);
    cr_expect_eq(tok_stream_feed(&st, bad[2], chunk, sizeof chunk), 0u, "held back until complete");
    w = tok_stream_flush(&st, chunk, sizeof chunk);
    cr_expect(w == 3 && !memcmp(chunk, "\xef\xbf\xbd", 3));
    close_vocab(x);
}

/* A .model file given with --tokenizer replaces the GGUF vocabulary for encoding: exporting the
 * GGUF's own vocabulary and loading it back must tokenize identically. */
Test(tokenizer, exported_model_file_tokenizes_identically)
{
    vocab_fixture x = open_vocab(TD "tiny/tiny-llama-f16.gguf");
    char path[] = "/tmp/kvchat-spm-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    char err[512];
    cr_assert(tok_export_model(x.v, path, err, sizeof err) == 0, "%s", err);
    tok_vocab *o;
    cr_assert(tok_create(&o, x.f, path, err, sizeof err) == 0, "%s", err);
    size_t tl;
    char *text = slurp(TD "prompts/p3.txt", &tl);
    int32_t *a, *b;
    size_t na, nb;
    cr_assert(tok_encode(x.v, text, tl, 1, 0, &a, &na, err, sizeof err) == 0);
    cr_assert(tok_encode(o, text, tl, 1, 0, &b, &nb, err, sizeof err) == 0);
    cr_expect_eq(na, nb);
    cr_expect(na == nb && !memcmp(a, b, na * sizeof *a));
    free(a);
    free(b);
    free(text);
    tok_free(o);
    /* the same file serves another GGUF with the same 32000-piece vocabulary */
    gguf_file *g;
    cr_assert(gguf_open(&g, TD "vocab/llama-spm.gguf", err, sizeof err) == 0);
    tok_vocab *same;
    cr_expect(tok_create(&same, g, path, err, sizeof err) == 0, "%s", err);
    tok_free(same);
    gguf_free(g);
    unlink(path);
    close_vocab(x);
}

Test(tokenizer, tokenizer_override_must_exist)
{
    gguf_file *f;
    tok_vocab *v;
    char err[512];
    cr_assert(gguf_open(&f, TD "vocab/llama-spm.gguf", err, sizeof err) == 0);
    cr_expect_eq(tok_create(&v, f, "/nonexistent/tokenizer.model", err, sizeof err), -1);
    cr_expect(strstr(err, "/nonexistent/tokenizer.model"), "%s", err);
    gguf_free(f);
}

/* The default model's vocabulary (skipped when it has not been fetched). */
Test(tokenizer, gemma3_turn_markers)
{
    char path[512];
    const char *home = getenv("HOME");
    snprintf(path, sizeof path, "%s/.cache/kvchat/models/gemma-3-270m-q4_k_m.gguf", home ? home : "");
    FILE *chk = fopen(path, "rb");
    if (!chk) cr_skip_test("default model not present at %s", path);
    fclose(chk);
    gguf_file *f;
    tok_vocab *v;
    char err[512];
    cr_assert(gguf_open(&f, path, err, sizeof err) == 0, "%s", err);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cr_assert(tok_create(&v, f, NULL, err, sizeof err) == 0, "%s", err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    cr_log_info("Gemma 3 tokenizer (262144 pieces) built in %.0f ms",
                (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
    cr_expect_eq(tok_n_vocab(v), 262144);
    cr_expect_eq(tok_bos(v), 2);
    cr_expect_eq(tok_eot(v), 106);
    cr_expect(tok_is_eog(v, 1) && tok_is_eog(v, 106) && !tok_is_eog(v, 107));
    struct { const char *s; int32_t id; } one[] = { { "<start_of_turn>", 105 }, { "<end_of_turn>", 106 }, { "\n", 107 } };
    for (int i = 0; i < 3; i++) {
        int32_t *ids;
        size_t n;
        cr_assert(tok_encode(v, one[i].s, strlen(one[i].s), 0, 1, &ids, &n, err, sizeof err) == 0, "%s", err);
        cr_expect(n == 1 && ids[0] == one[i].id, "'%s' -> %zu ids, first %d", one[i].s, n, n ? ids[0] : -1);
        free(ids);
    }
    int32_t *ids;
    size_t n;
    cr_assert(tok_encode(v, "<start_of_turn>", 15, 0, 0, &ids, &n, err, sizeof err) == 0);
    cr_expect(n > 1, "without special parsing the marker is ordinary text");
    free(ids);
    /* no dummy prefix on Gemma: "Hello" and " Hello" differ */
    int32_t *a, *b;
    size_t na, nb;
    cr_assert(tok_encode(v, "Hello", 5, 0, 0, &a, &na, err, sizeof err) == 0);
    cr_assert(tok_encode(v, " Hello", 6, 0, 0, &b, &nb, err, sizeof err) == 0);
    cr_expect(na != nb || memcmp(a, b, na * sizeof *a) != 0);
    char *back = tok_decode(v, a, na);
    cr_expect_str_eq(back, "Hello");
    free(back);
    free(a);
    free(b);
    tok_free(v);
    gguf_free(f);
}
