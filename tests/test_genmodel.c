/* test_genmodel.c - random-weight models written as GGUF files (engine/genmodel.c).
 *
 * The type mix against the reference quantizer's own files (the tiny Q4_K_M models' tensor types)
 * and against the rule as model-facts states it for Gemma 3 270M; the tiny test shapes written and
 * read back: the same tensors (names, shapes, types) and hyperparameters as the tiny reference
 * models, the copied vocabulary, N(0, 0.02) weights and unit norms, the same weights in every mix,
 * the same bytes for a seed whatever the thread count, and refusals (a vocabulary that is not
 * SentencePiece, an existing file); the vocabulary-only file tokenizing as its model. Files go to a
 * fresh directory under /tmp. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/quant.h"
#include "engine/genmodel.h"
#include "engine/gguf.h"
#include "engine/gguf_write.h"
#include "engine/model.h"
#include "engine/tokenizer.h"

#define TINY "../shared/testdata/tiny/"

static char dir[256];

static void mkdir_tmp(void)
{
    snprintf(dir, sizeof dir, "/tmp/kvchat-gen-XXXXXX");
    cr_assert(mkdtemp(dir), "mkdtemp");
}

static void rm_dir(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(genmodel, .init = mkdir_tmp, .fini = rm_dir);

/* layer number of "blk.N.", -1 otherwise */
static int layer_of(const char *name)
{
    int l;
    return sscanf(name, "blk.%d.", &l) == 1 ? l : -1;
}

Test(genmodel, q4_k_m_types_are_the_reference_quantizers)
{
    const char *files[] = { TINY "tiny-llama-q4_k_m.gguf", TINY "tiny-gemma3-q4_k_m.gguf" };
    for (int fi = 0; fi < 2; fi++) {
        char err[512];
        gguf_file *f;
        cr_assert(gguf_open(&f, files[fi], err, sizeof err) == 0, "%s", err);
        uint32_t n_layer;
        gguf_str arch;
        cr_assert(gguf_get_str(f, "general.architecture", &arch) == 0);
        char key[64];
        snprintf(key, sizeof key, "%.*s.block_count", (int)arch.len, arch.ptr);
        cr_assert(gguf_get_u32(f, key, &n_layer) == 0);
        int tied = gguf_find_tensor(f, "output.weight") == NULL, checked = 0;
        for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
            const gguf_tensor *t = gguf_tensor_at(f, i);
            if (t->n_dims != 2) continue;
            char name[96];
            snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
            uint32_t want = gen_weight_type(GEN_Q4_K_M, name, layer_of(name), (int)n_layer, t->ne[0], tied);
            cr_expect_eq(want, t->type, "%s %s: the rule gives %s, the reference tool wrote %s", files[fi], name,
                         quant_type_name(want), quant_type_name(t->type));
            checked++;
        }
        cr_assert(checked >= 30);
        gguf_free(f);
    }
}

Test(genmodel, gemma3_270m_mix_is_the_one_model_facts_derives)
{
    /* model-facts 3.11: attn_v Q8_0 and ffn_down Q6_K on layers 0 1 4 7 10 13 15 16 17, else Q5_0 and
     * Q4_K; q, k, gate, up Q5_0; attn_output Q4_K; the tied embedding Q8_0 */
    const int more[] = { 0, 1, 4, 7, 10, 13, 15, 16, 17 };
    for (int il = 0; il < 18; il++) {
        int m = 0;
        for (int k = 0; k < 9; k++) m |= more[k] == il;
        cr_expect_eq(gen_weight_type(GEN_Q4_K_M, "blk.x.attn_v.weight", il, 18, 640, 1),
                     m ? GGML_TYPE_Q8_0 : GGML_TYPE_Q5_0, "layer %d", il);
        cr_expect_eq(gen_weight_type(GEN_Q4_K_M, "blk.x.ffn_down.weight", il, 18, 2048, 1),
                     m ? GGML_TYPE_Q6_K : GGML_TYPE_Q4_K, "layer %d", il);
        cr_expect_eq(gen_weight_type(GEN_Q4_K_M, "blk.x.attn_q.weight", il, 18, 640, 1), GGML_TYPE_Q5_0);
        cr_expect_eq(gen_weight_type(GEN_Q4_K_M, "blk.x.attn_output.weight", il, 18, 1024, 1), GGML_TYPE_Q4_K);
    }
    cr_expect_eq(gen_weight_type(GEN_Q4_K_M, "token_embd.weight", -1, 18, 640, 1), GGML_TYPE_Q8_0);
    /* an untied embedding stays at the base type; the output of whole super-blocks is Q6_K */
    cr_expect_eq(gen_weight_type(GEN_Q4_K_M, "token_embd.weight", -1, 32, 4096, 0), GGML_TYPE_Q4_K);
    cr_expect_eq(gen_weight_type(GEN_Q4_K_M, "output.weight", -1, 32, 4096, 0), GGML_TYPE_Q6_K);
    cr_expect_eq(gen_weight_type(GEN_Q8_0, "output.weight", -1, 32, 4096, 0), GGML_TYPE_Q8_0);
    cr_expect_eq(gen_weight_type(GEN_F16, "blk.3.ffn_down.weight", 3, 32, 14336, 0), GGML_TYPE_F16);
}

Test(genmodel, shapes_are_the_real_models)
{
    const gen_shape *m = gen_find_shape("mistral-7b"), *l = gen_find_shape("llama-8b"), *g = gen_find_shape("gemma3-270m");
    cr_assert(m && l && g && !gen_find_shape("gpt-2"));
    cr_expect(m->n_layer == 32 && m->n_embd == 4096 && m->n_head == 32 && m->n_head_kv == 8 && m->head_dim == 128 &&
              m->n_ff == 14336 && m->rope_base == 1e6f && m->n_ctx == 32768 && !m->tied);
    cr_expect(l->n_layer == 32 && l->n_embd == 4096 && l->n_head_kv == 8 && l->n_ff == 14336 && l->rope_base == 500000.0f &&
              l->n_ctx == 8192 && !l->tied);
    cr_expect(g->n_layer == 18 && g->n_embd == 640 && g->n_head == 4 && g->n_head_kv == 1 && g->head_dim == 256 &&
              g->n_ff == 2048 && g->window == 512 && g->n_ctx == 32768 && g->tied && g->rms_eps == 1e-6f);
    enum gen_mix mx;
    cr_expect(gen_parse_mix("Q4_K_M", &mx) == 0 && mx == GEN_Q4_K_M);
    cr_expect(gen_parse_mix("q4_0", &mx) == -1);
}

static void gen(const char *shape, enum gen_mix mix, uint64_t seed, int threads, const char *vocab, const char *name,
                char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s", dir, name);
    gen_request r = { gen_find_shape(shape), mix, vocab, path, seed, 1, threads, NULL, NULL };
    char err[600];
    cr_assert_eq(gen_model_write(&r, NULL, NULL, err, sizeof err), 0, "%s", err);
}

/* The generated tiny shape has exactly the tensors (names, shapes, types) of the reference tool's
 * file of that shape, and loads with the same hyperparameters. */
static void same_layout(const char *generated, const char *reference)
{
    char err[600];
    gguf_file *a, *b;
    cr_assert(gguf_open(&a, generated, err, sizeof err) == 0, "%s", err);
    cr_assert(gguf_open(&b, reference, err, sizeof err) == 0, "%s", err);
    cr_assert_eq(gguf_n_tensors(a), gguf_n_tensors(b));
    for (int64_t i = 0; i < gguf_n_tensors(b); i++) {
        const gguf_tensor *t = gguf_tensor_at(b, i);
        char name[96];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        const gguf_tensor *u = gguf_find_tensor(a, name);
        cr_assert(u, "%s: no %s", generated, name);
        cr_expect(u->type == t->type && u->n_dims == t->n_dims && u->ne[0] == t->ne[0] && u->ne[1] == t->ne[1],
                  "%s: %s is %s [%lld, %lld], the reference has %s [%lld, %lld]", generated, name,
                  quant_type_name(u->type), (long long)u->ne[0], (long long)u->ne[1], quant_type_name(t->type),
                  (long long)t->ne[0], (long long)t->ne[1]);
    }
    /* the vocabulary, byte for byte */
    for (int64_t i = 0; i < gguf_n_kv(b); i++) {
        gguf_str k = gguf_key_name(b, i);
        if (k.len < 10 || memcmp(k.ptr, "tokenizer.", 10)) continue;
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)k.len, k.ptr);
        int64_t j = gguf_find_key(a, key);
        const void *r1, *r2;
        uint64_t l1, l2;
        cr_assert(j >= 0 && gguf_kv_raw(b, i, &r1, &l1) == 0 && gguf_kv_raw(a, j, &r2, &l2) == 0, "%s", key);
        cr_expect(l1 == l2 && !memcmp(r1, r2, (size_t)l1), "%s differs", key);
    }
    gguf_free(a);
    gguf_free(b);
    model *ma, *mb;
    cr_assert(model_load(&ma, generated, NULL, err, sizeof err) == 0, "%s", err);
    cr_assert(model_load(&mb, reference, NULL, err, sizeof err) == 0, "%s", err);
    const model_hparams *x = &ma->hp, *y = &mb->hp;
    cr_expect(x->n_layer == y->n_layer && x->n_embd == y->n_embd && x->n_head == y->n_head &&
              x->n_head_kv == y->n_head_kv && x->head_dim == y->head_dim && x->n_ff == y->n_ff &&
              x->n_swa == y->n_swa && x->rope_base == y->rope_base && x->norm_eps == y->norm_eps &&
              x->n_ctx_train == y->n_ctx_train && x->gelu == y->gelu && x->rope_neox == y->rope_neox,
              "%s: hyperparameters differ from %s", generated, reference);
    for (int il = 0; il < x->n_layer; il++) cr_expect_eq(ma->layers[il].is_swa, mb->layers[il].is_swa);
    model_free(ma);
    model_free(mb);
}

Test(genmodel, tiny_shapes_have_the_reference_files_layout)
{
    char p1[300], p2[300];
    gen("tiny-llama", GEN_Q4_K_M, 7, 2, TINY "tiny-llama-f16.gguf", "l.gguf", p1, sizeof p1);
    same_layout(p1, TINY "tiny-llama-q4_k_m.gguf");
    gen("tiny-gemma3", GEN_Q4_K_M, 7, 2, TINY "tiny-gemma3-f16.gguf", "g.gguf", p2, sizeof p2);
    same_layout(p2, TINY "tiny-gemma3-q4_k_m.gguf");
    gen("tiny-gemma3", GEN_F16, 7, 2, TINY "tiny-gemma3-f16.gguf", "g16.gguf", p2, sizeof p2);
    same_layout(p2, TINY "tiny-gemma3-f16.gguf");
}

static int same_bytes(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    cr_assert(fa && fb);
    int same = 1, ca, cb;
    do {
        ca = fgetc(fa);
        cb = fgetc(fb);
        if (ca != cb) same = 0;
    } while (same && ca != EOF);
    fclose(fa);
    fclose(fb);
    return same;
}

Test(genmodel, a_seed_gives_the_same_file_on_any_thread_count)
{
    char a[300], b[300], c[300];
    gen("tiny-llama", GEN_Q4_K_M, 42, 1, TINY "tiny-llama-f16.gguf", "a.gguf", a, sizeof a);
    gen("tiny-llama", GEN_Q4_K_M, 42, 3, TINY "tiny-llama-f16.gguf", "b.gguf", b, sizeof b);
    gen("tiny-llama", GEN_Q4_K_M, 43, 3, TINY "tiny-llama-f16.gguf", "c.gguf", c, sizeof c);
    cr_expect(same_bytes(a, b), "1 and 3 threads wrote different files");
    cr_expect(!same_bytes(a, c), "seeds 42 and 43 wrote the same file");
}

/* Rows of tensor name of file path, dequantized: [rows][ne0]. */
static float *rows_of(const char *path, const char *name, int64_t *ne0, int64_t *rows)
{
    char err[512];
    gguf_file *f;
    cr_assert(gguf_open(&f, path, err, sizeof err) == 0, "%s", err);
    const gguf_tensor *t = gguf_find_tensor(f, name);
    cr_assert(t, "%s: %s", path, name);
    *ne0 = t->ne[0];
    *rows = t->ne[1];
    float *x = malloc(sizeof(float) * (size_t)(t->ne[0] * t->ne[1]));
    size_t rb = quant_row_size(t->type, t->ne[0]);
    for (int64_t r = 0; r < t->ne[1]; r++)
        quant_dequant_row(t->type, (const uint8_t *)t->data + (size_t)r * rb, x + r * t->ne[0], t->ne[0]);
    gguf_free(f);
    return x;
}

Test(genmodel, weights_are_normal_0_02_norms_one_and_every_mix_holds_the_same_weights)
{
    char f16[300], q8[300];
    gen("tiny-gemma3", GEN_F16, 5, 2, TINY "tiny-llama-f16.gguf", "f16.gguf", f16, sizeof f16);
    gen("tiny-gemma3", GEN_Q8_0, 5, 2, TINY "tiny-llama-f16.gguf", "q8.gguf", q8, sizeof q8);
    int64_t n0, nr, m0, mr;
    float *a = rows_of(f16, "token_embd.weight", &n0, &nr);
    float *b = rows_of(q8, "token_embd.weight", &m0, &mr);
    cr_assert(n0 == m0 && nr == mr && n0 == 384 && nr == 32000);
    double s = 0, s2 = 0, s4 = 0;
    int64_t n = n0 * nr;
    for (int64_t i = 0; i < n; i++) {
        s += a[i];
        s2 += (double)a[i] * a[i];
        s4 += (double)a[i] * a[i] * a[i] * a[i];
    }
    double mean = s / n, var = s2 / n - mean * mean, kurt = s4 / n / (var * var);
    /* 12.3M samples: the mean's standard error is 6e-6, the deviation's about 4e-6 */
    cr_expect(fabs(mean) < 5e-5, "mean %g", mean);
    cr_expect(fabs(sqrt(var) - 0.02) < 1e-4, "standard deviation %g", sqrt(var));
    cr_expect(fabs(kurt - 3.0) < 0.02, "kurtosis %g (a normal distribution has 3)", kurt);
    /* the Q8_0 file holds the same weights, within Q8_0's half step of the block maximum / 127 */
    for (int64_t blk = 0; blk < n / 32; blk++) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(a[blk * 32 + i]));
        for (int i = 0; i < 32; i++) {
            /* the f16 file holds the weights rounded to f16: half an f16 step more */
            double tol = 0.57 * amax / 127 + fabs(a[blk * 32 + i]) * 0x1p-11;
            cr_assert(fabs((double)a[blk * 32 + i] - b[blk * 32 + i]) <= tol, "element %lld: %g vs %g",
                      (long long)(blk * 32 + i), a[blk * 32 + i], b[blk * 32 + i]);
        }
    }
    free(a);
    free(b);
    char err[512];
    gguf_file *f;
    cr_assert(gguf_open(&f, q8, err, sizeof err) == 0, "%s", err);
    int norms = 0;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if (t->n_dims != 1) continue;
        cr_assert_eq(t->type, GGML_TYPE_F32);
        for (int64_t k = 0; k < t->ne[0]; k++) {
            float v;
            memcpy(&v, (const uint8_t *)t->data + 4 * k, 4);
            cr_assert(v == 1.0f);
        }
        norms++;
    }
    cr_expect_eq(norms, 1 + 6 * 6, "output_norm and six norms a layer");
    gguf_free(f);
}

Test(genmodel, refuses_a_vocabulary_that_is_not_sentencepiece_and_an_existing_file)
{
    char vocab[300], err[600], out[300];
    snprintf(vocab, sizeof vocab, "%s/bpe.gguf", dir);
    gguf_writer *w = gguf_writer_create(0);
    const char *toks[2] = { "a", "b" };
    gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, 2);
    cr_assert_eq(gguf_w_begin(w, vocab, 0, err, sizeof err), 0, "%s", err);
    cr_assert_eq(gguf_w_finish(w, err, sizeof err), 0, "%s", err);
    gguf_writer_free(w);
    snprintf(out, sizeof out, "%s/never.gguf", dir);
    gen_request r = { gen_find_shape("tiny-llama"), GEN_F16, vocab, out, 0, 0, 1, NULL, NULL };
    cr_assert_eq(gen_model_write(&r, NULL, NULL, err, sizeof err), -1);
    cr_expect(strstr(err, "not SentencePiece"), "%s", err);
    cr_expect(access(out, F_OK) != 0);
    /* an existing file: -2 without overwrite, replaced with it */
    r.vocab_path = TINY "tiny-llama-f16.gguf";
    r.out_path = vocab;
    cr_assert_eq(gen_model_write(&r, NULL, NULL, err, sizeof err), -2);
    r.overwrite = 1;
    cr_assert_eq(gen_model_write(&r, NULL, NULL, err, sizeof err), 0, "%s", err);
    r.vocab_path = "/nonexistent.gguf";
    cr_assert_eq(gen_model_write(&r, NULL, NULL, err, sizeof err), -1);
    cr_expect(strstr(err, "/nonexistent.gguf"), "%s", err);
}

/* Ctrl-C: the flag stops the writing before the next block of rows; nothing stays behind. */
static volatile sig_atomic_t stop_flag;
static void stop_after_a_while(void *ud, uint64_t done, uint64_t total)
{
    (void)ud;
    if (done * 3 > total) stop_flag = 1;
}

Test(genmodel, an_abort_flag_stops_it_and_leaves_nothing)
{
    char out[300], err[600];
    snprintf(out, sizeof out, "%s/stopped.gguf", dir);
    stop_flag = 0;
    gen_request r = { gen_find_shape("tiny-llama"), GEN_Q4_K_M, TINY "tiny-llama-f16.gguf", out, 0, 0, 2, &stop_flag, NULL };
    cr_assert_eq(gen_model_write(&r, stop_after_a_while, NULL, err, sizeof err), -3);
    cr_expect(strstr(err, "interrupted"), "%s", err);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s')\"", dir);
    cr_expect_eq(system(cmd), 0, "the directory is empty after the stop");
}

/* The vocabulary-only file (gen_vocab_write) tokenizes as the model it came from: the same size and
 * special tokens, the same ids for plain, accented, spaced and special-token text; it holds no
 * tensors, says what it is, and the same bytes go to a stream as to a file. For both tiny
 * vocabularies (Llama 2's pieces and Gemma 3's). */
Test(genmodel, a_vocabulary_file_tokenizes_as_its_model)
{
    const char *srcs[] = { TINY "tiny-llama-f16.gguf", TINY "tiny-gemma3-f16.gguf" };
    const char *texts[] = { "Hello, world!", "  two  spaces\tand a tab\n", "caf\xc3\xa9 na\xc3\xafve \xe2\x82\xac 42",
                            "<start_of_turn>user\nhi<end_of_turn>", "<s>[INST] x [/INST]</s>" };
    for (int i = 0; i < 2; i++) {
        char path[300], err[600];
        int64_t n_pieces = 0;
        snprintf(path, sizeof path, "%s/vocab%d.gguf", dir, i);
        cr_assert_eq(gen_vocab_write(srcs[i], path, 0, NULL, &n_pieces, err, sizeof err), 0, "%s", err);
        gguf_file *src = NULL, *v = NULL;
        cr_assert(gguf_open(&src, srcs[i], err, sizeof err) == 0, "%s", err);
        cr_assert(gguf_open(&v, path, err, sizeof err) == 0, "%s", err);
        cr_expect_eq(gguf_n_tensors(v), 0);
        gguf_str name, arch_a, arch_b;
        cr_expect(gguf_get_str(v, "general.name", &name) == 0 && gguf_str_eq(name, "vocabulary"));
        cr_expect(gguf_get_str(v, "general.architecture", &arch_a) == 0 &&
                  gguf_get_str(src, "general.architecture", &arch_b) == 0 && arch_a.len == arch_b.len &&
                  !memcmp(arch_a.ptr, arch_b.ptr, arch_a.len));
        tok_vocab *ta = NULL, *tb = NULL;
        cr_assert(tok_create(&ta, src, NULL, err, sizeof err) == 0, "%s", err);
        cr_assert(tok_create(&tb, v, NULL, err, sizeof err) == 0, "%s: %s", path, err);
        cr_expect_eq(n_pieces, tok_n_vocab(ta));
        cr_expect_eq(tok_n_vocab(tb), tok_n_vocab(ta));
        cr_expect(tok_bos(tb) == tok_bos(ta) && tok_eos(tb) == tok_eos(ta) && tok_eot(tb) == tok_eot(ta) &&
                  tok_add_bos(tb) == tok_add_bos(ta));
        for (size_t t = 0; t < sizeof texts / sizeof *texts; t++) {
            int32_t *ia = NULL, *ib = NULL;
            size_t na = 0, nb = 0;
            cr_assert(tok_encode(ta, texts[t], strlen(texts[t]), 1, 1, &ia, &na, err, sizeof err) == 0, "%s", err);
            cr_assert(tok_encode(tb, texts[t], strlen(texts[t]), 1, 1, &ib, &nb, err, sizeof err) == 0, "%s", err);
            cr_expect(na == nb && na > 1 && !memcmp(ia, ib, na * sizeof *ia), "%s: '%s' tokenizes differently", srcs[i],
                      texts[t]);
            free(ia);
            free(ib);
        }
        tok_free(ta);
        tok_free(tb);
        gguf_free(src);
        gguf_free(v);
        /* a stream gets the file's bytes */
        FILE *s = tmpfile(), *f = fopen(path, "rb");
        cr_assert(s && f);
        cr_assert_eq(gen_vocab_write(srcs[i], "a stream", 0, s, &n_pieces, err, sizeof err), 0, "%s", err);
        rewind(s);
        int a, b;
        long at = 0;
        do {
            a = fgetc(f);
            b = fgetc(s);
            at++;
        } while (a == b && a != EOF);
        cr_expect(a == EOF && b == EOF, "the streamed vocabulary differs from the file at byte %ld", at - 1);
        fclose(s);
        fclose(f);
        /* an existing file: -2, and the file stays */
        cr_expect_eq(gen_vocab_write(srcs[i], path, 0, NULL, &n_pieces, err, sizeof err), -2);
    }
    char err[600], out[300];
    int64_t n_pieces = 0;
    snprintf(out, sizeof out, "%s/never.gguf", dir);
    cr_expect_eq(gen_vocab_write("/nonexistent.gguf", out, 0, NULL, &n_pieces, err, sizeof err), -1);
    cr_expect(strstr(err, "/nonexistent.gguf"), "%s", err);
    cr_expect(access(out, F_OK) != 0);
}
