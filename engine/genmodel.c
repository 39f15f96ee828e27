/* genmodel.c - random-weight models written as GGUF files (see genmodel.h).
 *
 * The tensors are listed first (their sizes fix the header), then each is produced a block of rows
 * at a time: the rows are split over threads, each row drawn from its own generator (seeded by the
 * file's seed, the tensor's name and the row) and quantized with common/quant.c's reference
 * quantizers, and the block is streamed to the writer before the next is made. */
#include "engine/genmodel.h"

#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "common/quant.h"
#include "engine/gguf.h"
#include "engine/gguf_write.h"

/* Real models' hyperparameters (their configurations and GGUF files; Gemma 3 270M as the default
 * model's file has them), and the tiny test models' shapes (../shared/testdata). */
static const gen_shape SHAPES[] = {
    { "gemma3-270m", "gemma3", "Gemma-3-270M-shaped random", 18, 640, 4, 1, 256, 2048, 32768, 1e6f, 512, 1e-6f, 1 },
    { "mistral-7b", "llama", "Mistral-7B-shaped random", 32, 4096, 32, 8, 128, 14336, 32768, 1e6f, 0, 1e-5f, 0 },
    { "llama-8b", "llama", "Llama-3-8B-shaped random", 32, 4096, 32, 8, 128, 14336, 8192, 500000.0f, 0, 1e-5f, 0 },
    { "tiny-llama", "llama", "tiny-llama-shaped random", 4, 256, 8, 2, 32, 512, 4096, 10000.0f, 0, 1e-5f, 0 },
    { "tiny-gemma3", "gemma3", "tiny-gemma3-shaped random", 6, 384, 4, 1, 64, 768, 8192, 1e6f, 32, 1e-6f, 1 },
};
#define N_SHAPES ((int)(sizeof SHAPES / sizeof SHAPES[0]))

int gen_n_shapes(void) { return N_SHAPES; }
const gen_shape *gen_shape_at(int i) { return i >= 0 && i < N_SHAPES ? &SHAPES[i] : NULL; }

const gen_shape *gen_find_shape(const char *name)
{
    for (int i = 0; i < N_SHAPES; i++)
        if (!strcmp(SHAPES[i].name, name)) return &SHAPES[i];
    return NULL;
}

static const char *MIX_NAMES[] = { "f16", "q8_0", "q4_k_m" };

int gen_parse_mix(const char *s, enum gen_mix *out)
{
    for (int i = 0; i < 3; i++)
        if (!strcasecmp(s, MIX_NAMES[i])) {
            *out = (enum gen_mix)i;
            return 0;
        }
    return -1;
}

const char *gen_mix_name(enum gen_mix m) { return (unsigned)m < 3 ? MIX_NAMES[m] : "?"; }

/* The reference quantizer's "more bits" layers: the first and last eighth, and every third layer
 * between (model-facts 3.11). */
static int more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

uint32_t gen_weight_type(enum gen_mix m, const char *name, int layer, int n_layer, int64_t ne0, int tied)
{
    if (m == GEN_F16) return GGML_TYPE_F16;
    if (m == GEN_Q8_0) return GGML_TYPE_Q8_0;
    uint32_t t = GGML_TYPE_Q4_K;
    int is_output = !strcmp(name, "output.weight") || (tied && !strcmp(name, "token_embd.weight"));
    if (is_output) {
        /* the output keeps 6 bits, or 8 where the row is not made of whole super-blocks */
        return ne0 % QK_K ? GGML_TYPE_Q8_0 : GGML_TYPE_Q6_K;
    }
    if ((ends_with(name, "attn_v.weight") || ends_with(name, "ffn_down.weight")) && more_bits(layer, n_layer))
        t = GGML_TYPE_Q6_K;
    if (ne0 % QK_K) t = t == GGML_TYPE_Q6_K ? GGML_TYPE_Q8_0 : GGML_TYPE_Q5_0;
    return t;
}

/* ---------------------------------------------------------------- the tensor list */

typedef struct gen_tensor {
    char name[64];
    int n_dims;
    int64_t ne[2];
    uint32_t type;
    int layer;
} gen_tensor;

typedef struct tensor_list {
    gen_tensor *t;
    int n, cap;
} tensor_list;

static int add_tensor(tensor_list *l, const char *name, int layer, int64_t ne0, int64_t ne1, uint32_t type)
{
    if (l->n == l->cap) {
        int nc = l->cap ? l->cap * 2 : 64;
        gen_tensor *nt = realloc(l->t, sizeof *nt * (size_t)nc);
        if (!nt) return -1;
        l->t = nt;
        l->cap = nc;
    }
    gen_tensor *t = &l->t[l->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = ne1 > 0 ? 2 : 1;
    t->ne[0] = ne0;
    t->ne[1] = ne1 > 0 ? ne1 : 1;
    t->type = type;
    t->layer = layer;
    return 0;
}

/* Every tensor of shape s with a vocabulary of n_vocab, in the order the file holds them. */
static int list_tensors(const gen_shape *s, enum gen_mix mix, int64_t n_vocab, tensor_list *l)
{
    const int64_t E = s->n_embd, Q = (int64_t)s->n_head * s->head_dim, KV = (int64_t)s->n_head_kv * s->head_dim;
    const int64_t F = s->n_ff;
    const int gemma = !strcmp(s->arch, "gemma3");
    int rc = 0;
#define W(name, layer, ne0, ne1) \
    rc |= add_tensor(l, name, layer, ne0, ne1, gen_weight_type(mix, name, layer, s->n_layer, ne0, s->tied))
#define NORM(name, n) rc |= add_tensor(l, name, -1, n, 0, GGML_TYPE_F32)
    W("token_embd.weight", -1, E, n_vocab);
    if (!s->tied) W("output.weight", -1, E, n_vocab);
    NORM("output_norm.weight", E);
    for (int il = 0; il < s->n_layer; il++) {
        char nm[64];
#define LN(role) (snprintf(nm, sizeof nm, "blk.%d." role ".weight", il), nm)
        NORM(LN("attn_norm"), E);
        W(LN("attn_q"), il, E, Q);
        W(LN("attn_k"), il, E, KV);
        W(LN("attn_v"), il, E, KV);
        W(LN("attn_output"), il, Q, E);
        if (gemma) {
            NORM(LN("attn_q_norm"), s->head_dim);
            NORM(LN("attn_k_norm"), s->head_dim);
            NORM(LN("post_attention_norm"), E);
        }
        NORM(LN("ffn_norm"), E);
        W(LN("ffn_gate"), il, E, F);
        W(LN("ffn_up"), il, E, F);
        W(LN("ffn_down"), il, F, E);
        if (gemma) NORM(LN("post_ffw_norm"), E);
#undef LN
    }
#undef W
#undef NORM
    return rc;
}

/* ---------------------------------------------------------------- metadata */

static int put_metadata(gguf_writer *w, const gen_shape *s, enum gen_mix mix, const gguf_file *vocab, int64_t n_vocab,
                        uint64_t seed)
{
    char key[96], desc[160];
    int rc = 0;
#define K(suffix) (snprintf(key, sizeof key, "%s.%s", s->arch, suffix), key)
    rc |= gguf_w_str(w, "general.architecture", s->arch);
    rc |= gguf_w_str(w, "general.name", s->title);
    snprintf(desc, sizeof desc, "random N(0, 0.02) weights of the %s shape, seed %llu (kvchat gen-model)", s->name,
             (unsigned long long)seed);
    rc |= gguf_w_str(w, "general.description", desc);
    rc |= gguf_w_u32(w, "general.file_type", mix == GEN_F16 ? 1u : mix == GEN_Q8_0 ? 7u : 15u);
    if (mix != GEN_F16) rc |= gguf_w_u32(w, "general.quantization_version", 2);
    rc |= gguf_w_u32(w, K("context_length"), s->n_ctx);
    rc |= gguf_w_u32(w, K("embedding_length"), (uint32_t)s->n_embd);
    rc |= gguf_w_u32(w, K("block_count"), (uint32_t)s->n_layer);
    rc |= gguf_w_u32(w, K("feed_forward_length"), (uint32_t)s->n_ff);
    rc |= gguf_w_u32(w, K("attention.head_count"), (uint32_t)s->n_head);
    rc |= gguf_w_u32(w, K("attention.head_count_kv"), (uint32_t)s->n_head_kv);
    rc |= gguf_w_f32(w, K("rope.freq_base"), s->rope_base);
    rc |= gguf_w_f32(w, K("attention.layer_norm_rms_epsilon"), s->rms_eps);
    if (!strcmp(s->arch, "gemma3")) {
        rc |= gguf_w_u32(w, K("attention.key_length"), (uint32_t)s->head_dim);
        rc |= gguf_w_u32(w, K("attention.value_length"), (uint32_t)s->head_dim);
        if (s->window) rc |= gguf_w_u32(w, K("attention.sliding_window"), s->window);
    } else {
        rc |= gguf_w_u32(w, K("rope.dimension_count"), (uint32_t)s->head_dim);
        rc |= gguf_w_u32(w, K("vocab_size"), (uint32_t)n_vocab);
    }
#undef K
    for (int64_t i = 0; i < gguf_n_kv(vocab); i++) {
        gguf_str k = gguf_key_name(vocab, i);
        if (k.len > 10 && !memcmp(k.ptr, "tokenizer.", 10)) rc |= gguf_w_copy_kv(w, vocab, i);
    }
    return rc ? -1 : 0;
}

/* ---------------------------------------------------------------- random rows */

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* Row r of a tensor: N(0, 0.02) values by Box-Muller over a counter-based generator. */
static void random_row(uint64_t seed, uint64_t tensor, int64_t r, float *x, int64_t n)
{
    uint64_t s = mix64(seed ^ mix64(tensor ^ mix64((uint64_t)r + 0x9E3779B97F4A7C15ull)));
    for (int64_t i = 0; i < n; i += 2) {
        uint64_t z = mix64(s += 0x9E3779B97F4A7C15ull);
        float u1 = (float)((z >> 40) + 1) * 0x1p-24f;   /* (0, 1] */
        float u2 = (float)(z & 0xFFFFFFu) * 0x1p-24f;   /* [0, 1) */
        float rad = 0.02f * sqrtf(-2.0f * logf(u1)), th = 6.28318530717958648f * u2;
        x[i] = rad * cosf(th);
        if (i + 1 < n) x[i + 1] = rad * sinf(th);
    }
}

typedef struct block_job {
    const gen_tensor *t;
    uint64_t seed, tensor;
    size_t row_bytes;
    int64_t r0, r1;         /* the block's rows */
    uint8_t *out;           /* (r1 - r0) * row_bytes */
    int n_workers;
} block_job;

typedef struct worker {
    block_job *j;
    int idx;
    float *row;
} worker;

static void *work_rows(void *p)
{
    worker *wk = p;
    block_job *j = wk->j;
    int64_t n = j->r1 - j->r0, per = (n + j->n_workers - 1) / j->n_workers;
    int64_t a = j->r0 + per * wk->idx, b = a + per < j->r1 ? a + per : j->r1;
    for (int64_t r = a; r < b; r++) {
        random_row(j->seed, j->tensor, r, wk->row, j->t->ne[0]);
        quant_quantize_row(j->t->type, wk->row, j->out + (size_t)(r - j->r0) * j->row_bytes, j->t->ne[0]);
    }
    return NULL;
}

/* Rows [j->r0, j->r1) on n threads (this one included). 0, or -1 when a thread cannot start. */
static int run_block(block_job *j, worker *wk, pthread_t *th)
{
    int started = 0, rc = 0;
    for (int i = 1; i < j->n_workers; i++) {
        wk[i].j = j;
        wk[i].idx = i;
        if (pthread_create(&th[i], NULL, work_rows, &wk[i])) {
            rc = -1;
            break;
        }
        started = i;
    }
    wk[0].j = j;
    wk[0].idx = 0;
    if (rc == 0) work_rows(&wk[0]);
    for (int i = 1; i <= started; i++) pthread_join(th[i], NULL);
    return rc;
}

/* ---------------------------------------------------------------- the file */

static int open_vocab(const char *path, gguf_file **out, int64_t *n_vocab, char *err, size_t errlen)
{
    if (gguf_open(out, path, err, errlen)) return -1;
    gguf_str model;
    enum gguf_vtype et;
    uint64_t n;
    const void *data;
    if (gguf_get_str(*out, "tokenizer.ggml.model", &model) != 0 || gguf_get_arr(*out, "tokenizer.ggml.tokens", &et, &n, &data) != 0 ||
        et != GGUF_VT_STRING || n == 0) {
        snprintf(err, errlen, "%s: no vocabulary in the file (tokenizer.ggml.model and tokens)", path);
        goto bad;
    }
    if (!gguf_str_eq(model, "llama")) {
        snprintf(err, errlen, "%s: its vocabulary is '%.*s', not SentencePiece ('llama'): kvchat reads SentencePiece only",
                 path, (int)(model.len > 40 ? 40 : model.len), model.ptr);
        goto bad;
    }
    if (n > INT32_MAX) {
        snprintf(err, errlen, "%s: %llu tokens is too many", path, (unsigned long long)n);
        goto bad;
    }
    *n_vocab = (int64_t)n;
    return 0;
bad:
    gguf_free(*out);
    *out = NULL;
    return -1;
}

int gen_model_write(const gen_request *r, gen_progress_fn progress, void *ud, char *err, size_t errlen)
{
    const gen_shape *s = r->shape;
    gguf_file *vocab = NULL;
    gguf_writer *w = NULL;
    tensor_list tl = { 0 };
    uint8_t *out = NULL;
    float *rows = NULL;
    worker *wk = NULL;
    pthread_t *th = NULL;
    int rc = -1;
    int64_t n_vocab = 0;
    if (open_vocab(r->vocab_path, &vocab, &n_vocab, err, errlen)) return -1;
    if (list_tensors(s, r->mix, n_vocab, &tl) || !(w = gguf_writer_create(0))) {
        snprintf(err, errlen, "out of memory");
        goto done;
    }
    /* a failure here is kept by the writer and reported by gguf_w_begin */
    (void)put_metadata(w, s, r->mix, vocab, n_vocab, r->seed);
    for (int i = 0; i < tl.n; i++) gguf_w_tensor(w, tl.t[i].name, tl.t[i].n_dims, tl.t[i].ne, tl.t[i].type);
    rc = r->out_stream ? gguf_w_begin_stream(w, r->out_stream, r->out_path, err, errlen)
                       : gguf_w_begin(w, r->out_path, r->overwrite, err, errlen);
    if (rc) goto done;
    rc = -1;
    int n_threads = r->n_threads > 0 ? r->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 256) n_threads = 256;
    /* a block of about 4M values: 16 MiB of rows before quantization, shared by the threads */
    int64_t max_ne0 = 0;
    for (int i = 0; i < tl.n; i++) max_ne0 = tl.t[i].ne[0] > max_ne0 ? tl.t[i].ne[0] : max_ne0;
    const int64_t block_values = (int64_t)1 << 22;
    size_t out_cap = 0;
    for (int i = 0; i < tl.n; i++) {
        int64_t br = block_values / tl.t[i].ne[0];
        if (br < 1) br = 1;
        if (br > tl.t[i].ne[1]) br = tl.t[i].ne[1];
        size_t need = (size_t)br * quant_row_size(tl.t[i].type, tl.t[i].ne[0]);
        if (need > out_cap) out_cap = need;
    }
    out = malloc(out_cap);
    rows = malloc(sizeof(float) * (size_t)max_ne0 * (size_t)n_threads);
    wk = calloc((size_t)n_threads, sizeof *wk);
    th = calloc((size_t)n_threads, sizeof *th);
    if (!out || !rows || !wk || !th) {
        snprintf(err, errlen, "out of memory");
        goto done;
    }
    for (int i = 0; i < n_threads; i++) wk[i].row = rows + (size_t)i * (size_t)max_ne0;
    uint64_t total = gguf_w_data_bytes(w), written = 0;
    for (int i = 0; i < tl.n; i++) {
        const gen_tensor *t = &tl.t[i];
        size_t rb = quant_row_size(t->type, t->ne[0]);
        if (t->n_dims == 1) {
            /* norms: ones */
            for (int64_t k = 0; k < t->ne[0]; k++) ((float *)out)[k] = 1.0f;
            if (gguf_w_data(w, out, rb, err, errlen)) goto done;
            written += rb;
            continue;
        }
        int64_t br = block_values / t->ne[0];
        if (br < 1) br = 1;
        for (int64_t r0 = 0; r0 < t->ne[1]; r0 += br) {
            if (r->abort_flag && *r->abort_flag) {
                snprintf(err, errlen, "interrupted");
                rc = -3;
                goto done;
            }
            block_job j = { t, r->seed, name_hash(t->name), rb, r0, r0 + br < t->ne[1] ? r0 + br : t->ne[1], out,
                            n_threads };
            if ((j.r1 - j.r0) < n_threads) j.n_workers = (int)(j.r1 - j.r0);
            if (run_block(&j, wk, th)) {
                snprintf(err, errlen, "cannot start a thread");
                goto done;
            }
            size_t nb = (size_t)(j.r1 - j.r0) * rb;
            if (gguf_w_data(w, out, nb, err, errlen)) goto done;
            written += nb;
            if (progress) progress(ud, written, total);
        }
    }
    rc = gguf_w_finish(w, err, errlen);
done:
    gguf_writer_free(w);
    gguf_free(vocab);
    free(tl.t);
    free(out);
    free(rows);
    free(wk);
    free(th);
    return rc;
}

/* A vocabulary-only file: general.architecture (when the source has one), a name saying what it is,
 * and every tokenizer.* entry, no tensors. gen-model reads nothing else from --vocab, so a model
 * written with this file as its vocabulary is the one written with the source's. */
int gen_vocab_write(const char *vocab_path, const char *out_path, int overwrite, FILE *out_stream, int64_t *n_pieces,
                    char *err, size_t errlen)
{
    gguf_file *vocab = NULL;
    int64_t n_vocab = 0;
    if (open_vocab(vocab_path, &vocab, &n_vocab, err, errlen)) return -1;
    gguf_writer *w = gguf_writer_create(0);
    if (!w) {
        gguf_free(vocab);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    /* a failure here is kept by the writer and reported by gguf_w_begin */
    int64_t arch = gguf_find_key(vocab, "general.architecture");
    if (arch >= 0) (void)gguf_w_copy_kv(w, vocab, arch);
    (void)gguf_w_str(w, "general.type", "vocab");
    (void)gguf_w_str(w, "general.name", "vocabulary");
    for (int64_t i = 0; i < gguf_n_kv(vocab); i++) {
        gguf_str k = gguf_key_name(vocab, i);
        if (k.len > 10 && !memcmp(k.ptr, "tokenizer.", 10)) (void)gguf_w_copy_kv(w, vocab, i);
    }
    int rc = out_stream ? gguf_w_begin_stream(w, out_stream, out_path, err, errlen)
                        : gguf_w_begin(w, out_path, overwrite, err, errlen);
    if (!rc) rc = gguf_w_finish(w, err, errlen);
    gguf_writer_free(w);
    gguf_free(vocab);
    if (!rc) *n_pieces = n_vocab;
    return rc;
}
