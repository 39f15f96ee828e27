/* fuzz_snapshot.c - libFuzzer harness for the snapshot parser (engine/snapshot.c, with the cache,
 * policy and sampler sections it reads), the parser of untrusted bytes from the session database.
 *
 * Each input is tried as it is (the header, length and checksum checks) and with its length field
 * and trailing sha256 fixed up, so mutations reach the section parsers behind the checksum. The
 * fixed-up bytes are restored into a live sequence under every policy set with state (H2O + CHESS,
 * LASER-KV + SentKV, Chelsea); whatever is accepted then samples and decodes a few tokens, where a
 * bad sampler ring, page list or policy state would bite. A refusal must be a C string and leave
 * the sequence as it was: empty cache, fresh policy and sampler state. The bytes as they are go
 * through all three sequences only when they need no fix-up (then they are the same input); else
 * through one, which must refuse them: the length and checksum are checked before anything that
 * depends on the sequence.
 *
 * Speed (fuzz/README.md): the sequences are created once and emptied after each accepted restore
 * (cache rewound, fresh policy set, sampler reset; a refusal is checked to have changed nothing),
 * and the model is a micro Gemma 3 written at start-up (281-token vocabulary, 64 wide, 4 layers of
 * which 2 global, 2 KV heads), so a decode step costs microseconds. FUZZ_SNAPSHOT_MODEL=path runs
 * a real GGUF instead (the tiny Gemma: about 200 inputs/s). At start-up the harness writes a valid
 * snapshot of each set into $FUZZ_SNAPSHOT_SEED_DIR when set (the seeds, about 50 KiB each). */
#include <nettle/sha2.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/quant.h"
#include "engine/bytes.h"
#include "engine/forward.h"
#include "engine/gguf_write.h"
#include "engine/model.h"
#include "engine/policy/policy.h"
#include "engine/sampler.h"
#include "engine/snapshot.h"
#include "kernels/backend.h"

/* Small budgets, so the seeds' prefill and the decode steps after a restore evict (H2O), merge
 * (Chelsea) and compress (LASER-KV); H2O keeps 4 pages and CHESS keeps 1 sink and 1 window page,
 * so CHESS has candidates and saves a selection (with 3 pages or fewer it saves none). */
static const char *const SPECS[] = { "h2o:budget=0.6+chess:window=1,chunk=2,grid=2",
                                     "laser:budget=0.5,block=64,probe=8+sentkv:budget=24,len=8,delta=4",
                                     "chelsea:budget=24,sinks=4,recent=8,gap=8,chunk=16" };
#define N_SPECS (int)(sizeof SPECS / sizeof SPECS[0])
/* A small context: the limits (positions, pages, peaks) are reachable with small inputs. */
#define N_CTX 256
#define PAGE 8
#define STEPS 4

typedef struct seq {
    fwd_ctx *f;
    pol_set *ps;
    samp *s;
    pol_spec spec;
    pol_env env;
    bytes_w fresh_pol;   /* pol_set_save of a fresh set: what a refusal must leave */
    uint8_t *fresh_samp; /* samp_save_state after samp_reset */
} seq;

static model *m;
static int micro;   /* m is the micro model */
static be_backend *b;
static snap_identity id;
static seq seqs[N_SPECS];
static float *logits;
static uint8_t *samp_buf;
static bytes_w pol_buf;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void die(const char *what, const char *err)
{
    fprintf(stderr, "fuzz_snapshot: %s: %s\n", what, err);
    abort();
}

/* ------------------------------------------------------------------ the micro model */

enum { V_SPECIAL = 3, V_BYTES = 256 };
/* Normal pieces after <unk> <s> </s> and the 256 byte pieces: words, and the punctuation that
 * makes sentence boundaries for SentKV (engine/forward.c weighs . ! ? newline ; : ,). */
#define SP "\xe2\x96\x81"   /* U+2581, SentencePiece's space */
static const char *const WORDS[] = { SP "the", SP "a", SP "cat", SP "sat", SP "on", SP "mat", ".", ",", ";", ":", "!",
                                     "?", SP "end.", SP "so,", SP "it", SP "is", SP "not", SP "here", "s", "ed", "ing",
                                     SP };
#define N_WORDS (int)(sizeof WORDS / sizeof WORDS[0])
#define M_EMBD 64
#define M_HEAD 4
#define M_HEAD_KV 2
#define M_HEAD_DIM 32
#define M_FF 128
#define M_LAYER 4

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return ((float)(rng_state >> 40) * 0x1p-24f - 0.5f) * 0.1f;
}

/* A tensor's bytes: random F16 weights (ne0 x ne1), or an F32 norm of ones (ne1 0). */
static void put_tensor(gguf_writer *w, int ne0, int ne1)
{
    char err[512] = "cannot convert to f16";
    size_t n = (size_t)ne0 * (size_t)(ne1 > 0 ? ne1 : 1);
    float *x = malloc(sizeof(float) * n);
    uint16_t *h = malloc(sizeof(uint16_t) * n);
    if (!x || !h) die("micro model", "out of memory");
    for (size_t i = 0; i < n; i++) x[i] = ne1 > 0 ? rnd() : 1.0f;
    int bad = ne1 > 0 ? quant_quantize_row(GGML_TYPE_F16, x, h, (int64_t)n) != 0 ||
                            gguf_w_data(w, h, sizeof(uint16_t) * n, err, sizeof err) != 0
                      : gguf_w_data(w, x, sizeof(float) * n, err, sizeof err) != 0;
    if (bad) die("micro model", err);
    free(x);
    free(h);
}

/* Write the micro model to path: gemma3 with a sliding window of one page and every second layer
 * global (2 global layers, so per-global-layer policy state is indexed past its first entry). */
static void write_micro_model(const char *path)
{
    char err[512];
    gguf_writer *w = gguf_writer_create(0);
    if (!w) die("micro model", "out of memory");
    int n_vocab = V_SPECIAL + V_BYTES + N_WORDS;
    const char **tok = malloc(sizeof(char *) * (size_t)n_vocab);
    char (*bytes)[8] = malloc(8 * V_BYTES);
    float *score = malloc(sizeof(float) * (size_t)n_vocab);
    int32_t *type = malloc(sizeof(int32_t) * (size_t)n_vocab);
    if (!tok || !bytes || !score || !type) die("micro model", "out of memory");
    tok[0] = "<unk>";
    tok[1] = "<s>";
    tok[2] = "</s>";
    type[0] = TOK_UNKNOWN;
    type[1] = type[2] = TOK_CONTROL;
    for (int i = 0; i < V_BYTES; i++) {
        snprintf(bytes[i], sizeof bytes[i], "<0x%02X>", i);
        tok[V_SPECIAL + i] = bytes[i];
        type[V_SPECIAL + i] = TOK_BYTE;
    }
    for (int i = 0; i < N_WORDS; i++) {
        tok[V_SPECIAL + V_BYTES + i] = WORDS[i];
        type[V_SPECIAL + V_BYTES + i] = TOK_NORMAL;
    }
    for (int i = 0; i < n_vocab; i++) score[i] = i < V_SPECIAL + V_BYTES ? 0.0f : -(float)i;
    /* a failed call is kept by the writer and reported by gguf_w_begin */
    gguf_w_str(w, "general.architecture", "gemma3");
    gguf_w_str(w, "general.name", "fuzz_snapshot micro model");
    gguf_w_u32(w, "gemma3.context_length", N_CTX);
    gguf_w_u32(w, "gemma3.embedding_length", M_EMBD);
    gguf_w_u32(w, "gemma3.block_count", M_LAYER);
    gguf_w_u32(w, "gemma3.feed_forward_length", M_FF);
    gguf_w_u32(w, "gemma3.attention.head_count", M_HEAD);
    gguf_w_u32(w, "gemma3.attention.head_count_kv", M_HEAD_KV);
    gguf_w_u32(w, "gemma3.attention.key_length", M_HEAD_DIM);
    gguf_w_u32(w, "gemma3.attention.value_length", M_HEAD_DIM);
    gguf_w_f32(w, "gemma3.rope.freq_base", 1e6f);
    gguf_w_f32(w, "gemma3.attention.layer_norm_rms_epsilon", 1e-6f);
    gguf_w_u32(w, "gemma3.attention.sliding_window", PAGE);
    gguf_w_u32(w, "gemma3.attention.sliding_window_pattern", 2);
    gguf_w_str(w, "tokenizer.ggml.model", "llama");
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", tok, (uint64_t)n_vocab);
    gguf_w_arr(w, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, score, (uint64_t)n_vocab);
    gguf_w_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, type, (uint64_t)n_vocab);
    gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gguf_w_u32(w, "tokenizer.ggml.eos_token_id", 2);
    gguf_w_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    /* the tensors: ne0 first (a row), then the rows; 1-D norms have no rows */
    typedef struct { const char *name; int ne0, ne1; } tensor;
    tensor t[4 + 13 * M_LAYER];
    char names[13 * M_LAYER][48];
    int nt = 0, nn = 0;
    t[nt++] = (tensor){ "token_embd.weight", M_EMBD, n_vocab };
    t[nt++] = (tensor){ "output_norm.weight", M_EMBD, 0 };
    static const struct { const char *role; int ne0, ne1; } L[] = {
        { "attn_norm", M_EMBD, 0 },
        { "attn_q", M_EMBD, M_HEAD * M_HEAD_DIM },
        { "attn_k", M_EMBD, M_HEAD_KV * M_HEAD_DIM },
        { "attn_v", M_EMBD, M_HEAD_KV * M_HEAD_DIM },
        { "attn_output", M_HEAD * M_HEAD_DIM, M_EMBD },
        { "attn_q_norm", M_HEAD_DIM, 0 },
        { "attn_k_norm", M_HEAD_DIM, 0 },
        { "post_attention_norm", M_EMBD, 0 },
        { "ffn_norm", M_EMBD, 0 },
        { "ffn_gate", M_EMBD, M_FF },
        { "ffn_up", M_EMBD, M_FF },
        { "ffn_down", M_FF, M_EMBD },
        { "post_ffw_norm", M_EMBD, 0 },
    };
    for (int il = 0; il < M_LAYER; il++)
        for (size_t r = 0; r < sizeof L / sizeof L[0]; r++) {
            snprintf(names[nn], sizeof names[nn], "blk.%d.%s.weight", il, L[r].role);
            t[nt++] = (tensor){ names[nn++], L[r].ne0, L[r].ne1 };
        }
    for (int i = 0; i < nt; i++) {
        int64_t ne[2] = { t[i].ne0, t[i].ne1 };
        if (gguf_w_tensor(w, t[i].name, t[i].ne1 > 0 ? 2 : 1, ne, t[i].ne1 > 0 ? GGML_TYPE_F16 : GGML_TYPE_F32))
            die("micro model", t[i].name);
    }
    if (gguf_w_begin(w, path, 1, err, sizeof err)) die("micro model", err);
    for (int i = 0; i < nt; i++) put_tensor(w, t[i].ne0, t[i].ne1);
    if (gguf_w_finish(w, err, sizeof err)) die("micro model", err);
    gguf_writer_free(w);
    free(tok);
    free(bytes);
    free(score);
    free(type);
}

/* The micro model, written to a private temporary directory and removed once loaded. */
static void load_micro_model(void)
{
    char err[512], dir[4096], path[4200];
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/fuzz_snapshot.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) die("mkdtemp", dir);
    snprintf(path, sizeof path, "%s/micro.gguf", dir);
    write_micro_model(path);
    if (model_load(&m, path, NULL, err, sizeof err)) die("micro model", err);
    unlink(path);
    rmdir(dir);
}

/* ------------------------------------------------------------------ sequences */

/* A fresh policy set on q's sequence (the previous one, if any, freed). */
static void fresh_policies(seq *q)
{
    char err[512];
    pol_set_free(q->ps);
    q->ps = pol_set_create(&q->spec, &q->env, err, sizeof err);
    if (!q->ps) die("pol_set_create", err);
    fwd_set_policy(q->f, q->ps);
}

static void seq_open(seq *q, const char *spec_text)
{
    char err[512];
    fwd_opts fo = { N_CTX, 32, PAGE };
    q->f = fwd_create(m, b, &fo, err, sizeof err);
    if (!q->f) die("fwd_create", err);
    if (pol_parse(&q->spec, spec_text, NULL, err, sizeof err)) die(spec_text, err);
    fwd_policy_env(q->f, &q->env);
    fresh_policies(q);
    if (pol_set_check(q->ps, N_CTX, err, sizeof err)) die(spec_text, err);
    samp_params sp = samp_params_default();
    sp.repeat_penalty = 1.1f;   /* the penalty reads the restored ring of recent tokens */
    q->s = samp_create(&sp, m->hp.n_vocab);
    if (!q->s) die("samp_create", "out of memory");
    pol_set_save(q->ps, &q->fresh_pol);
    q->fresh_samp = malloc(samp_state_size());
    if (q->fresh_pol.err || !q->fresh_samp) die("seq_open", "out of memory");
    samp_save_state(q->s, q->fresh_samp);
}

/* Back to what seq_open left: an empty cache with no rewind floor or mark, a fresh policy set and
 * a reset sampler (what restoring into a newly created sequence would see). */
static int cache_empty(const seq *q)
{
    const kv_cache *kv = fwd_kv(q->f);
    if (fwd_pos(q->f) != 0) return 0;
    for (int il = 0; il < kv_n_layer(kv); il++)
        for (int h = 0; h < kv_n_head_kv(kv); h++)
            if (kv_n_pages(kv, il, h) != 0) return 0;
    return 1;
}

static void seq_empty(seq *q)
{
    fwd_rewind(q->f, 0);
    fwd_set_floor(q->f, 0);
    fwd_set_mark(q->f, -1);
    if (!cache_empty(q)) __builtin_trap();   /* a rewind to 0 that kept something */
    fresh_policies(q);
    samp_reset(q->s);
}

/* 1 when q is as seq_empty left it: no positions, no pages, the fresh policy and sampler state. */
static int seq_untouched(seq *q)
{
    if (!cache_empty(q)) return 0;
    samp_save_state(q->s, samp_buf);
    if (memcmp(samp_buf, q->fresh_samp, samp_state_size()) != 0) return 0;
    pol_buf.n = 0;
    pol_set_save(q->ps, &pol_buf);
    return !pol_buf.err && pol_buf.n == q->fresh_pol.n && memcmp(pol_buf.p, q->fresh_pol.p, pol_buf.n) == 0;
}

/* The seed: a prefill past the budgets and a few decode steps, saved. */
static void write_seed(seq *q, int k, const char *dir)
{
    char err[512];
    enum { N = 64, PREFILL = 48 };
    int32_t toks[N];
    int32_t nv = m->hp.n_vocab;
    for (int i = 0; i < N; i++)
        /* mostly words, every seventh a punctuation mark (sentence ends for SentKV) */
        toks[i] = i % 7 == 6 ? nv - N_WORDS + 6 + i % 6 : V_SPECIAL + (i * 37) % (nv - V_SPECIAL);
    if (!micro)   /* a real model (FUZZ_SNAPSHOT_MODEL) */
        for (int i = 0; i < N; i++) toks[i] = 3 + (i * 37) % (nv - 3);
    if (fwd_eval(q->f, toks, PREFILL, logits, NULL, NULL, NULL, NULL, NULL, err, sizeof err)) die("seed prefill", err);
    for (int i = 0; i < PREFILL; i++) samp_accept(q->s, toks[i]);
    for (int i = PREFILL; i < N - 1; i++) {
        samp_accept(q->s, toks[i]);
        if (fwd_decode(q->f, toks[i], logits, NULL, err, sizeof err)) die("seed decode", err);
    }
    void *d;
    size_t n;
    if (snap_save(q->f, q->s, &id, toks, N, &d, &n, err, sizeof err)) die("snap_save", err);
    char path[4096];
    snprintf(path, sizeof path, "%s/valid-%d.snap", dir, k);
    FILE *o = fopen(path, "wb");
    if (o) {
        fwrite(d, 1, n, o);
        fclose(o);
    }
    free(d);
    seq_empty(q);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char err[512];
    const char *real = getenv("FUZZ_SNAPSHOT_MODEL");
    if (real && *real) {
        if (model_load(&m, real, NULL, err, sizeof err)) die(real, err);
    } else {
        load_micro_model();
        micro = 1;
    }
    if (!(b = be_cpu_create(1, err, sizeof err))) die("be_cpu_create", err);
    logits = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
    samp_buf = malloc(samp_state_size());
    if (!logits || !samp_buf) die("init", "out of memory");
    const char *dir = getenv("FUZZ_SNAPSHOT_SEED_DIR");
    for (int k = 0; k < N_SPECS; k++) {
        seq_open(&seqs[k], SPECS[k]);
        if (k == 0)
            snap_identity_of(seqs[k].f, "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a", &id);
        if (dir) write_seed(&seqs[k], k, dir);
        if (!seq_untouched(&seqs[k])) die("seq_empty", "does not return the sequence to its fresh state");
    }
    return 0;
}

/* ------------------------------------------------------------------ the target */

/* Restore into q; 1 when accepted (then decoded a few steps and emptied again). */
static int try_one(seq *q, const uint8_t *data, size_t size)
{
    char err[1024];
    int32_t *ids = NULL;
    int64_t n;
    if (snap_restore(q->f, q->s, data, size, &id, &ids, &n, err, sizeof err) != 0) {
        /* a refusal is a C string and leaves the sequence untouched (so nothing needs emptying) */
        if (!memchr(err, 0, sizeof err) || !seq_untouched(q)) __builtin_trap();
        return 0;
    }
    /* the restored sequence must work: a few sampled steps from its last id */
    int32_t tok = n > 0 ? ids[n - 1] : 1;
    for (int step = 0; step < STEPS && fwd_pos(q->f) < N_CTX; step++) {
        if (fwd_decode(q->f, tok, logits, NULL, err, sizeof err) != 0) {
            if (!memchr(err, 0, sizeof err)) __builtin_trap();
            break;
        }
        tok = samp_sample(q->s, logits);
        if (tok < 0 || tok >= m->hp.n_vocab) __builtin_trap();
        samp_accept(q->s, tok);
    }
    free(ids);
    seq_empty(q);
    return 1;
}

static void try_all(const uint8_t *data, size_t size)
{
    for (int k = 0; k < N_SPECS; k++) try_one(&seqs[k], data, size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 24 + SHA256_DIGEST_SIZE) {
        /* shorter than a header and checksum: refused before anything depends on the sequence */
        if (try_one(&seqs[0], data, size)) __builtin_trap();
        return 0;
    }
    uint8_t *fx = malloc(size);
    memcpy(fx, data, size);
    int64_t plen = (int64_t)(size - 24 - SHA256_DIGEST_SIZE);
    memcpy(fx + 16, &plen, sizeof plen);
    struct sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, size - SHA256_DIGEST_SIZE, fx);
    sha256_digest(&c, SHA256_DIGEST_SIZE, fx + size - SHA256_DIGEST_SIZE);
    if (memcmp(fx, data, size) == 0) {
        try_all(data, size);   /* length and checksum right already: as-is and fixed up are one input */
    } else {
        /* As it is, the input fails the length or checksum check, which comes before anything that
         * depends on the sequence: one sequence is enough to see it refused, and it must be. */
        if (try_one(&seqs[0], data, size)) __builtin_trap();
        try_all(fx, size);
    }
    free(fx);
    return 0;
}
