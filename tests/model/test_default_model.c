/* test_default_model.c - tests on the default model (Gemma 3 270M Q4_K_M, path in $KVCHAT_MODEL, set
 * by `make test`): greedy answers to fixed factual prompts, and `kvchat logits` over a 4,000-token
 * document whose text repeats, so that the model must copy from more than a sliding window back -
 * only the global-attention layers can see the earlier copy; and `kvchat gen-model`'s gemma3-270m
 * shape against the default model's own file, from the model's vocabulary and from a vocabulary-only
 * file of it. */
#include <ctype.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "app/eval/evalres.h"
#include "common/quant.h"
#include "kernels/backend.h"
#include "engine/forward.h"
#include "engine/genmodel.h"
#include "engine/gguf.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"

static const char *model_path(void)
{
    const char *p = getenv("KVCHAT_MODEL");
    cr_assert(p && *p, "KVCHAT_MODEL must name the default model (make test sets it)");
    return p;
}

static model *M;
static be_backend *B;

static void setup(void)
{
    char err[512];
    cr_assert(model_load(&M, model_path(), NULL, err, sizeof err) == 0, "%s", err);
    B = be_cpu_create(0, err, sizeof err);
    cr_assert(B, "%s", err);
}

static void teardown(void)
{
    be_free(B);
    model_free(M);
}

/* Greedy continuation of a plain-text prompt (the default model is a base model: completion, not chat). */
static void greedy(const char *prompt, int n, char *out, size_t cap)
{
    char err[512];
    int32_t *ids;
    size_t n_ids;
    cr_assert(tok_encode(M->vocab, prompt, strlen(prompt), 1, 0, &ids, &n_ids, err, sizeof err) == 0, "%s", err);
    fwd_opts fo = { 256, 0, 0 };
    fwd_ctx *f = fwd_create(M, B, &fo, err, sizeof err);
    cr_assert(f, "%s", err);
    float *logits = malloc(sizeof(float) * (size_t)M->hp.n_vocab);
    cr_assert(fwd_eval(f, ids, (int64_t)n_ids, logits, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    tok_stream ts;
    tok_stream_init(&ts, M->vocab);
    size_t len = 0;
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        int32_t id = samp_argmax(logits, M->hp.n_vocab);
        if (tok_is_eog(M->vocab, id)) break;
        len += tok_stream_feed(&ts, id, out + len, cap - len);
        cr_assert(fwd_eval(f, &id, 1, logits, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    }
    len += tok_stream_flush(&ts, out + len, cap - len);
    cr_log_info("'%s' -> '%s'", prompt, out);
    free(logits);
    free(ids);
    fwd_free(f);
}

TestSuite(default_model, .init = setup, .fini = teardown, .timeout = 600);

Test(default_model, paris_is_the_capital_of_france)
{
    char out[512];
    greedy("Paris is the capital of", 8, out, sizeof out);
    cr_expect(!strncmp(out, " France", 7), "got '%s'", out);
}

Test(default_model, chemical_symbol_of_gold)
{
    char out[512];
    greedy("The chemical symbol for gold is", 8, out, sizeof out);
    cr_expect(!strncmp(out, " Au", 3), "got '%s'", out);
}

Test(default_model, water_molecule)
{
    char out[512];
    greedy("A water molecule is made of two hydrogen atoms and one", 8, out, sizeof out);
    cr_expect(!strncmp(out, " oxygen", 7), "got '%s'", out);
}

/* Build a document of at least 4,000 tokens by repeating a ~850-token text, run `kvchat logits` on it,
 * and check the format and that, inside the last copy, the top-1 prediction is the next token of the
 * text at least 90% of the time (a model that cannot attend back ~850 positions copies far worse). */
Test(default_model, logits_on_a_4000_token_document, .timeout = 1200)
{
    FILE *src = fopen("../shared/testdata/prompts/p2.txt", "rb");
    cr_assert(src);
    static char text[8192];
    size_t tl = fread(text, 1, sizeof text - 1, src);
    fclose(src);
    text[tl] = 0;
    char err[512];
    /* Enough copies for >= 4000 tokens with this tokenizer. */
    int32_t *one;
    size_t n_one;
    cr_assert(tok_encode(M->vocab, text, tl, 0, 0, &one, &n_one, err, sizeof err) == 0, "%s", err);
    free(one);
    int copies = (int)(4000 / n_one) + 1;
    char path[] = "/tmp/kvchat-doc-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    for (int c = 0; c < copies; c++) cr_assert_eq(write(fd, text, tl), (ssize_t)tl);
    close(fd);
    char cmd[1024], outp[] = "/tmp/kvchat-doc-out-XXXXXX";
    int ofd = mkstemp(outp);
    cr_assert(ofd >= 0);
    close(ofd);
    const char *bin = getenv("KVCHAT_BIN") ? getenv("KVCHAT_BIN") : "./kvchat";
    snprintf(cmd, sizeof cmd, "%s logits -m '%s' -f %s --gen 4 > %s", bin, model_path(), path, outp);
    int st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "`%s` failed", cmd);
    FILE *o = fopen(outp, "r");
    cr_assert(o);
    static char line[1 << 16];
    int n_prompt = 0, n_pos = 0, n_step = 0;
    int32_t *ids = NULL;
    int32_t *top1 = NULL;
    while (fgets(line, sizeof line, o)) {
        if (!strncmp(line, "prompt_tokens ", 14)) {
            n_prompt = atoi(line + 14);
            ids = calloc((size_t)n_prompt, sizeof *ids);
            top1 = calloc((size_t)n_prompt, sizeof *top1);
        } else if (!strncmp(line, "ids ", 4)) {
            char *s = line + 4;
            for (int i = 0; i < n_prompt; i++) ids[i] = (int32_t)strtol(s, &s, 10);
        } else if (!strncmp(line, "pos ", 4)) {
            char *s = line + 4;
            int i = (int)strtol(s, &s, 10);
            cr_assert(i == n_pos, "pos lines out of order");
            s = strstr(s, "top5 ");
            cr_assert(s);
            top1[i] = (int32_t)strtol(s + 5, NULL, 10);
            cr_assert(!strstr(line, "nan") && !strstr(line, "inf"), "non-finite logit: %s", line);
            n_pos++;
        } else if (!strncmp(line, "step ", 5)) {
            n_step++;
        }
    }
    fclose(o);
    unlink(outp);
    unlink(path);
    cr_assert_geq(n_prompt, 4000);
    cr_assert_eq(n_pos, n_prompt);
    cr_assert_eq(n_step, 4);
    int hits = 0, total = 0;
    for (int i = n_prompt - (int)n_one + 8; i < n_prompt - 1; i++) {
        total++;
        hits += top1[i] == ids[i + 1];
    }
    cr_log_info("4000-token document: %d prompt tokens, copy accuracy in the last copy %d/%d", n_prompt, hits, total);
    cr_expect(hits >= total * 9 / 10, "copy accuracy %d/%d", hits, total);
    free(ids);
    free(top1);
}

/* A pass key a third of the way into ~3,600 tokens of varied filler sentences (far outside the recent
 * window and the sliding-window layers), asked with `kvchat ask`. The full cache and CHESS at a 10%
 * budget must answer it; StreamingLLM at the same budget keeps only the start and the end of the
 * document and must not (the control that shows the key is not reachable by accident). On this 270M
 * model CHESS does not find every needle: docs/policies.md lists the documents tried and which
 * policies answered; this one is among those CHESS answers, so the test guards the mechanism.
 * SnapKV, SentKVCompress and LASER-KV at 20% answer it too; TAKE (with delayed eviction) and H2O do
 * not on this model (docs/policies.md), so they are not asserted here. */
static void write_passkey_doc(const char *path)
{
    static const char *subj[] = { "The old farmer", "A young girl", "The captain", "My neighbour", "The baker",
                                  "A tired student", "The mayor", "Our teacher" };
    static const char *verb[] = { "walked to", "looked at", "painted", "talked about", "cleaned", "visited",
                                  "repaired", "forgot" };
    static const char *obj[] = { "the red barn", "the small boat", "a quiet library", "the long bridge",
                                 "a broken clock", "the village market", "an empty field", "the stone tower" };
    static const char *tail[] = { "in the morning.", "after lunch.", "during the storm.", "before the festival.",
                                  "with a smile.", "on a cold day.", "for an hour.", "without a word." };
    FILE *f = fopen(path, "w");
    cr_assert(f);
    uint64_t x = 3;
    for (int i = 0; i < 330; i++) {
        if (i == 120) fputs("The pass key is 71432. ", f);
        int r[4];
        for (int k = 0; k < 4; k++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            r[k] = (int)((x >> 33) & 7);
        }
        fprintf(f, "%s %s %s %s ", subj[r[0]], verb[r[1]], obj[r[2]], tail[r[3]]);
    }
    fclose(f);
}

static int answer_has_key(const char *doc, const char *policy)
{
    char cmd[1024], outp[] = "/tmp/kvchat-ask-out-XXXXXX";
    int ofd = mkstemp(outp);
    cr_assert(ofd >= 0);
    close(ofd);
    const char *bin = getenv("KVCHAT_BIN") ? getenv("KVCHAT_BIN") : "./kvchat";
    /* decode-time selection at 10%, eviction at 20% (as the two issues ask) */
    const char *budget = strstr(policy, "snapkv") || strstr(policy, "sentkv") || strstr(policy, "laser") ? "0.2" : "0.1";
    snprintf(cmd, sizeof cmd, "%s ask -m '%s' -d %s -q 'What is the pass key?' -n 8 --policy '%s' --budget %s > %s",
             bin, model_path(), doc, policy, budget, outp);
    if (!strcmp(policy, "full"))
        snprintf(cmd, sizeof cmd, "%s ask -m '%s' -d %s -q 'What is the pass key?' -n 8 > %s", bin, model_path(), doc,
                 outp);
    int st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "`%s` failed", cmd);
    FILE *o = fopen(outp, "r");
    cr_assert(o);
    char ans[512] = "";
    size_t n = fread(ans, 1, sizeof ans - 1, o);
    ans[n] = 0;
    fclose(o);
    unlink(outp);
    cr_log_info("%s: answer '%s'", policy, ans);
    return strstr(ans, "71432") != NULL;
}

Test(default_model, passkey_in_a_4000_token_document, .timeout = 1200)
{
    char doc[] = "/tmp/kvchat-passkey-XXXXXX";
    int fd = mkstemp(doc);
    cr_assert(fd >= 0);
    close(fd);
    write_passkey_doc(doc);
    cr_expect(answer_has_key(doc, "full"), "the full cache missed the pass key");
    cr_expect(answer_has_key(doc, "chess"), "CHESS at a 10%% budget missed the pass key");
    cr_expect(!answer_has_key(doc, "streaming"), "StreamingLLM at 10%% should not see the middle of the document");
    cr_expect(answer_has_key(doc, "snapkv"), "SnapKV at a 20%% budget evicted the pass key");
    cr_expect(answer_has_key(doc, "sentkv"), "SentKVCompress at a 20%% budget missed the pass key");
    cr_expect(answer_has_key(doc, "laser"), "LASER-KV at a 20%% budget evicted the pass key");
    unlink(doc);
}

/* The standard pass-key test's document: its filler repeated, the needle before repetition `at`
 * (what `kvchat eval --task passkey-std` writes). */
static void write_std_passkey_doc(const char *path, int reps, int at, int key)
{
    FILE *f = fopen(path, "w");
    cr_assert(f);
    for (int r = 0; r <= reps; r++) {
        if (r == at) fprintf(f, "%sThe pass key is %d. Remember it. %d is the pass key.", r ? " " : "", key, key);
        if (r < reps)
            fprintf(f, "%sThe grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.",
                    r || at == 0 ? " " : "");
    }
    fclose(f);
}

/* `kvchat ask` under policy (with budget, or none for the full cache): does the answer hold want? */
static int ask_answer_has(const char *doc, const char *policy, const char *budget, const char *want)
{
    char cmd[1024], outp[] = "/tmp/kvchat-ask-out-XXXXXX";
    int ofd = mkstemp(outp);
    cr_assert(ofd >= 0);
    close(ofd);
    const char *bin = getenv("KVCHAT_BIN") ? getenv("KVCHAT_BIN") : "./kvchat";
    snprintf(cmd, sizeof cmd, "%s ask -m '%s' -d %s -q 'What is the pass key?' -n 10 --policy '%s'%s%s > %s", bin,
             model_path(), doc, policy, budget ? " --budget " : "", budget ? budget : "", outp);
    int st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "`%s` failed", cmd);
    FILE *o = fopen(outp, "r");
    cr_assert(o);
    char ans[512] = "";
    size_t n = fread(ans, 1, sizeof ans - 1, o);
    ans[n] = 0;
    fclose(o);
    unlink(outp);
    cr_log_info("%s %s: answer '%s'", policy, budget ? budget : "", ans);
    return strstr(ans, want) != NULL;
}

/* Sample 2 of `kvchat eval --task passkey-std --ctx 2K --seed 1` (2,078 tokens, the key half way in).
 * Chelsea at 20% keeps it since it merges whenever a head passes budget + gap (issue 22); merging
 * the whole prompt at once, as it did before, folded the digits into filler centroids and the answer
 * was "a key that is used to". */
Test(default_model, chelsea_keeps_a_standard_pass_key_at_20_percent, .timeout = 1200)
{
    char doc[] = "/tmp/kvchat-stdkey-XXXXXX";
    int fd = mkstemp(doc);
    cr_assert(fd >= 0);
    close(fd);
    write_std_passkey_doc(doc, 85, 43, 72728);
    cr_expect(ask_answer_has(doc, "full", NULL, "72728"), "the full cache missed the pass key");
    cr_expect(ask_answer_has(doc, "chelsea", "0.2", "72728"), "Chelsea at a 20%% budget lost the pass key");
    unlink(doc);
}

/* The K/N of policy's row in eval's "Retrieved" table (| take | | 5/6 (83%) |); -1 when absent. */
static void retrieved_count(const char *out, const char *policy, int *k, int *n)
{
    char row[64];
    snprintf(row, sizeof row, "\n| %s |", policy);
    const char *tab = strstr(out, "Retrieved");
    const char *r = tab ? strstr(tab, row) : NULL;
    if (!r) return;
    r += strlen(row);
    while (*r && *r != '\n' && !isdigit((unsigned char)*r)) r++;
    if (sscanf(r, "%d/%d", k, n) != 2) *k = *n = -1;
}

/* TAKE misses the test document above by a hair on this model (docs/policies.md) but answers the
 * generated documents of `kvchat eval`: at a 20% budget, five of the first six at least, the full
 * cache all six. Sample 0 is a knife edge: its first digit came out 3 under the old portable kernels
 * and 1 under the AVX2 and AVX-512 ones, which computed the same sums in another order; since issue
 * 29 every kernel set gives the same bits (docs/numerics.md). The eval also runs the backtracking
 * loop with the shipped thresholds. */
/* `kvchat eval ARGS` on the default model: its output into out. */
static void eval_out(const char *args, char *out, size_t cap)
{
    char cmd[1024], outp[] = "/tmp/kvchat-eval-out-XXXXXX";
    int ofd = mkstemp(outp);
    cr_assert(ofd >= 0);
    close(ofd);
    const char *bin = getenv("KVCHAT_BIN") ? getenv("KVCHAT_BIN") : "./kvchat";
    snprintf(cmd, sizeof cmd, "%s eval -m '%s' %s > %s", bin, model_path(), args, outp);
    int st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "`%s` failed", cmd);
    FILE *o = fopen(outp, "r");
    cr_assert(o);
    size_t n = fread(out, 1, cap - 1, o);
    out[n] = 0;
    fclose(o);
    unlink(outp);
    cr_log_info("%s", out);
}

Test(default_model, take_answers_generated_passkey_documents, .timeout = 1200)
{
    char out[4096];
    eval_out("--task passkey --ctx 4000 --samples 6 --seed 1 -n 16 --policy full,take --budget 0.2", out, sizeof out);
    int full_k = -1, full_n = -1, take_k = -1, take_n = -1;
    retrieved_count(out, "full", &full_k, &full_n);
    retrieved_count(out, "take", &take_k, &take_n);
    cr_expect(full_k == 6 && full_n == 6, "the full cache missed a generated pass key:\n%s", out);
    cr_expect(take_k >= 5 && take_n == 6, "TAKE at 20%% missed more than one generated pass key:\n%s", out);
}

/* kvchat eval --together (a sample's decode-time configurations answered together, from forks of one
 * prefill) on the real model, whose multi-turn answers end at their lines' ends (each answer its
 * own stop) and whose CHESS goes back and generates pages again: every row's answer, score and
 * tokens are those of one configuration at a time. */
Test(default_model, eval_together_gives_the_answers_of_one_configuration_at_a_time, .timeout = 1200)
{
    char dir[] = "/tmp/kvchat-evb-XXXXXX", path[2][256], args[512], out[8192];
    cr_assert(mkdtemp(dir));
    eval_recs rs[2] = { { 0 } };
    for (int b = 0; b < 2; b++) {
        snprintf(path[b], sizeof path[b], "%s/%d.csv", dir, b);
        snprintf(args, sizeof args, "--task multiturn,passkey --ctx 1K --samples 2 --policy full,chess,quest,sentkv "
                 "--csv %s%s", path[b], b ? " --together" : "");
        eval_out(args, out, sizeof out);
        char err[256];
        cr_assert(evalres_read(path[b], &rs[b], err, sizeof err) == 0, "%s", err);
    }
    cr_assert(rs[0].n == rs[1].n && rs[0].n >= 30, "%zu and %zu rows", rs[0].n, rs[1].n);
    size_t matched = 0, lines = 0;
    for (size_t i = 0; i < rs[0].n; i++) {
        const eval_rec *a = &rs[0].v[i];
        for (size_t j = 0; j < rs[1].n; j++) {
            const eval_rec *c = &rs[1].v[j];
            if (strcmp(a->task, c->task) || a->sample != c->sample || a->turn != c->turn || strcmp(a->policy, c->policy) ||
                a->backtrack != c->backtrack)
                continue;
            matched++;
            lines += !strcmp(a->task, "multiturn") && a->answer_tokens < 20 && strcmp(a->policy, "nodoc");
            cr_expect(!strcmp(a->answer, c->answer) && a->correct == c->correct && a->answer_tokens == c->answer_tokens,
                      "%s #%d turn %d %s: '%s' (%lld tokens) one at a time, '%s' (%lld) batched", a->task, a->sample,
                      a->turn, a->policy, a->answer, (long long)a->answer_tokens, c->answer,
                      (long long)c->answer_tokens);
        }
    }
    cr_expect_eq(matched, rs[0].n);
    cr_expect(lines > 0, "no multi-turn answer ended at its line's end");
    for (int b = 0; b < 2; b++) {
        evalres_free(&rs[b]);
        unlink(path[b]);
    }
    rmdir(dir);
}

/* CHESS on the standard pass-key test (issue 29): the first SAMPLES documents of `kvchat eval --task
 * passkey-std --ctx 2K --seed 1` (needles at 10% to 90% depth). With the selection built once from
 * the mean of the last two pages' mean keys (three quarters filler at 2K) CHESS at 10% answered
 * none; with the anchor made of the last 16 tokens' keys (the question) it answers MIN or more. */
#define CHESS_STD_SAMPLES 10
#define CHESS_STD_MIN 5
Test(default_model, chess_answers_standard_pass_keys_at_10_percent, .timeout = 1200)
{
    char out[4096], args[256];
    snprintf(args, sizeof args, "--task passkey-std --ctx 2K --samples %d --seed 1 --policy full,chess --budget 0.1",
             CHESS_STD_SAMPLES);
    eval_out(args, out, sizeof out);
    int full_k = -1, full_n = -1, chess_k = -1, chess_n = -1;
    retrieved_count(out, "full", &full_k, &full_n);
    retrieved_count(out, "chess", &chess_k, &chess_n);
    cr_expect(full_n == CHESS_STD_SAMPLES && full_k >= CHESS_STD_MIN, "the full cache:\n%s", out);
    cr_expect(chess_n == CHESS_STD_SAMPLES && chess_k >= CHESS_STD_MIN,
              "CHESS at 10%% answered fewer than %d standard pass keys:\n%s", CHESS_STD_MIN, out);
}

/* The terminal interface on the default model in a real terminal (tmux): everything
 * tests/tui/basic.sh drives with a tiny model (open, ask, compare, switch the decode and the prefill
 * policy, edit into a branch, settings, file picker, session browser, resize to 60 and 200 columns,
 * help, quit, resume, regenerate, remapped keys, inline backtracking events), on the real model. */
Test(default_model, tui_in_a_real_terminal, .timeout = 900)
{
    char cmd[1024];
    const char *bin = getenv("KVCHAT_BIN") ? getenv("KVCHAT_BIN") : "./kvchat";
    snprintf(cmd, sizeof cmd, "tests/tui/basic.sh %s '%s' ../shared/testdata/prompts/p2.txt", bin, model_path());
    int st = system(cmd);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tests/tui/basic.sh on the default model failed (output above)");
}

/* gen-model's gemma3-270m shape in the q4_k_m mix is the default model's file but for the weights:
 * the same tensors with the same shapes and types, the same hyperparameters, the same vocabulary;
 * and the same bytes when the vocabulary comes from a vocabulary-only file. */
Test(default_model, gen_model_gemma3_270m_has_the_default_models_layout, .timeout = 600)
{
    char dir[] = "/tmp/kvchat-gen270-XXXXXX", path[300], err[600];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/g.gguf", dir);
    gen_request r = { gen_find_shape("gemma3-270m"), GEN_Q4_K_M, model_path(), path, 1, 0, 0, NULL, NULL };
    cr_assert_eq(gen_model_write(&r, NULL, NULL, err, sizeof err), 0, "%s", err);
    gguf_file *a, *b = M->gguf;
    cr_assert(gguf_open(&a, path, err, sizeof err) == 0, "%s", err);
    cr_assert_eq(gguf_n_tensors(a), gguf_n_tensors(b));
    for (int64_t i = 0; i < gguf_n_tensors(b); i++) {
        const gguf_tensor *t = gguf_tensor_at(b, i);
        char name[96];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        const gguf_tensor *u = gguf_find_tensor(a, name);
        cr_assert(u, "no %s", name);
        cr_expect(u->type == t->type && u->ne[0] == t->ne[0] && u->ne[1] == t->ne[1] && u->nbytes == t->nbytes,
                  "%s: %s, the default model's is %s", name, quant_type_name(u->type), quant_type_name(t->type));
    }
    for (int64_t i = 0; i < gguf_n_kv(b); i++) {
        gguf_str k = gguf_key_name(b, i);
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)k.len, k.ptr);
        if (!strncmp(key, "general.", 8)) continue;   /* name, license, tags: about the real model */
        int64_t j = gguf_find_key(a, key);
        const void *r1, *r2;
        uint64_t l1, l2;
        cr_assert(j >= 0, "%s missing", key);
        cr_assert(gguf_kv_raw(b, i, &r1, &l1) == 0 && gguf_kv_raw(a, j, &r2, &l2) == 0);
        cr_expect(l1 == l2 && !memcmp(r1, r2, (size_t)l1) && gguf_kv_type(a, j) == gguf_kv_type(b, i), "%s differs", key);
    }
    gguf_free(a);
    model *g;
    cr_assert(model_load(&g, path, NULL, err, sizeof err) == 0, "%s", err);
    cr_expect_eq(g->weight_bytes, M->weight_bytes);
    model_free(g);
    /* The vocabulary alone (gen-model --vocab-only), what a GPU machine the model cannot reach gets:
     * a few MiB, and the same model file, byte for byte, written from it. */
    char voc[300], from_voc[300], cmp[700];
    int64_t n_pieces = 0;
    snprintf(voc, sizeof voc, "%s/vocab.gguf", dir);
    snprintf(from_voc, sizeof from_voc, "%s/from-vocab.gguf", dir);
    cr_assert_eq(gen_vocab_write(model_path(), voc, 0, NULL, &n_pieces, err, sizeof err), 0, "%s", err);
    cr_expect_eq(n_pieces, M->hp.n_vocab);
    struct stat st;
    cr_assert(stat(voc, &st) == 0);
    cr_expect_lt(st.st_size, 16 << 20, "the vocabulary takes %lld bytes", (long long)st.st_size);
    r.vocab_path = voc;
    r.out_path = from_voc;
    cr_assert_eq(gen_model_write(&r, NULL, NULL, err, sizeof err), 0, "%s", err);
    snprintf(cmp, sizeof cmp, "cmp -s %s %s", path, from_voc);
    cr_expect_eq(system(cmp), 0, "the model written from the vocabulary-only file differs from the model's");
    snprintf(path, sizeof path, "rm -rf %s", dir);
    cr_assert_eq(system(path), 0);
}

/* A base model (issue 20, item 9): the welcome and the status bar say so, and an answer, in the
 * interface and from `ask`, stops where the model begins its next "Question:" instead of running
 * to the answer length (tests/tui/base.sh). */
Test(default_model, base_model_answers_stop_at_the_next_question, .timeout = 600)
{
    char cmd[1024];
    const char *bin = getenv("KVCHAT_BIN") ? getenv("KVCHAT_BIN") : "./kvchat";
    snprintf(cmd, sizeof cmd, "tests/tui/base.sh %s '%s' ../shared/testdata/prompts/p2.txt", bin, model_path());
    int st = system(cmd);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tests/tui/base.sh on the default model failed (output above)");
}

/* Issue 27, items 2 and 7: under a prefill policy the interface's first answer is ask's (the
 * document waits for the question); a refused open draws nothing; a document opened and left, or the
 * same text under another name, is restored from its snapshot (tests/tui/reuse.sh). */
Test(default_model, the_interface_answers_as_ask_and_never_reads_a_text_twice, .timeout = 600)
{
    char cmd[1024];
    const char *bin = getenv("KVCHAT_BIN") ? getenv("KVCHAT_BIN") : "./kvchat";
    snprintf(cmd, sizeof cmd, "tests/tui/reuse.sh %s '%s' tests/fixtures/docs/memo.txt", bin, model_path());
    int st = system(cmd);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tests/tui/reuse.sh on the default model failed (output above)");
}

/* `kvchat ask` in conversation name of the database db, greedy: the answer's text into out. */
static void ask_in_session(const char *db, const char *doc, const char *question, char *out, size_t cap)
{
    char cmd[2048], outp[256];
    snprintf(outp, sizeof outp, "%s.out", db);
    const char *bin = getenv("KVCHAT_BIN") ? getenv("KVCHAT_BIN") : "./kvchat";
    snprintf(cmd, sizeof cmd, "%s ask -m '%s' -d %s -q \"%s\" -n 256 --temp 0 --session memo --db %s > %s", bin,
             model_path(), doc, question, db, outp);
    int st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "`%s` failed", cmd);
    FILE *o = fopen(outp, "r");
    cr_assert(o);
    size_t n = fread(out, 1, cap - 1, o);
    out[n] = 0;
    fclose(o);
    unlink(outp);
}

/* Four different follow-up questions about one memo in one conversation (issue 27, item 1): the
 * memo is memo 0 of `bench/followups.py --seed 1` (tests/fixtures/followup_memo.txt), the questions
 * and the facts they ask for are its own. Each answer holds its fact and none repeats an earlier
 * one. Answers of 256 tokens, the interface's default: before a plain-form answer ended at its paragraph,
 * the first answer ran on with more of the memo, the conversation carried that text into the next
 * prompt, and the second question got "1000 units" (the memo says 978). */
Test(default_model, follow_up_questions_get_their_own_answers, .timeout = 600)
{
    static const char *const q[4][2] = { { "On what date is the design review?", "March 20" },
                                         { "How many units of the new sensor will be delivered?", "978" },
                                         { "In which room is the design review?", "276" },
                                         { "What is Ingrid's extension?", "9410" } };
    char dir[] = "/tmp/kvchat-followups-XXXXXX", db[128];
    cr_assert(mkdtemp(dir));
    snprintf(db, sizeof db, "%s/s.db", dir);
    char ans[4][2048];
    for (int i = 0; i < 4; i++) {
        ask_in_session(db, "tests/fixtures/followup_memo.txt", q[i][0], ans[i], sizeof ans[i]);
        cr_log_info("%s -> '%s'", q[i][0], ans[i]);
        cr_expect(strstr(ans[i], q[i][1]) != NULL, "question %d '%s': the answer '%s' lacks %s", i + 1, q[i][0],
                  ans[i], q[i][1]);
        for (int j = 0; j < i; j++)
            cr_expect(strcmp(ans[i], ans[j]) != 0, "question %d got question %d's answer back: '%s'", i + 1, j + 1,
                      ans[i]);
    }
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect(system(cmd) == 0);
}

/* Memo 15 of `bench/followups.py --seed 1` (tests/fixtures/followup_memo15.txt): the model begins
 * its first answer with a blank line. The blank line that ends a plain answer must not end it there,
 * empty: an empty first answer taught every later turn of the conversation to answer empty too. */
Test(default_model, an_answer_that_begins_with_a_blank_line_is_not_empty, .timeout = 600)
{
    char dir[] = "/tmp/kvchat-followups-XXXXXX", db[128];
    cr_assert(mkdtemp(dir));
    snprintf(db, sizeof db, "%s/s.db", dir);
    char ans[2][2048];
    const char *q[2] = { "Which company delivers the new sensor?", "What is Ezekiel's extension?" };
    for (int i = 0; i < 2; i++) {
        ask_in_session(db, "tests/fixtures/followup_memo15.txt", q[i], ans[i], sizeof ans[i]);
        cr_log_info("%s -> '%s'", q[i], ans[i]);
        const char *p = ans[i];
        while (*p && isspace((unsigned char)*p)) p++;
        cr_expect(*p, "question %d '%s': the answer is empty", i + 1, q[i]);
    }
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect(system(cmd) == 0);
}
