/* forward.c - Gemma 3 and Llama forward passes on the backend op table (see forward.h).
 *
 * Per layer: attention block (pre-norm, Q/K/V, Gemma's QK-norm, RoPE, scaled dot-product attention
 * against the cache, output projection, Gemma's post-norm, residual), then the gated FFN block (GeGLU
 * for Gemma, SwiGLU for Llama) the same way. Prefill runs in chunks of n_batch tokens; logits are
 * only computed for the positions someone asked for. */
#include "forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OUT_ROWS 16   /* rows of the vocabulary projection computed at once when all logits are wanted */

struct fwd_ctx {
    const model *m;
    be_backend *b;
    kv_cache *kv;
    int n_batch;
    /* scratch, [n_batch][...] */
    float *x, *h, *q, *k, *v, *att, *o, *gate, *up, *logits;
    int32_t *pos;
    uint64_t scratch_bytes;
};

static float *alloc_f(fwd_ctx *f, size_t n)
{
    f->scratch_bytes += n * sizeof(float);
    return malloc(n * sizeof(float));
}

fwd_ctx *fwd_create(const model *m, be_backend *b, const fwd_opts *o, char *err, size_t errlen)
{
    const model_hparams *hp = &m->hp;
    fwd_ctx *f = calloc(1, sizeof *f);
    if (!f) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    f->m = m;
    f->b = b;
    int64_t n_ctx = o && o->n_ctx > 0 ? o->n_ctx : hp->n_ctx_train;
    f->n_batch = o && o->n_batch > 0 ? o->n_batch : 512;
    if (f->n_batch > n_ctx) f->n_batch = (int)n_ctx;
    int64_t kvd = (int64_t)hp->n_head_kv * hp->head_dim;
    f->kv = kv_create(hp->n_layer, n_ctx, kvd, err, errlen);
    if (!f->kv) {
        free(f);
        return NULL;
    }
    size_t B = (size_t)f->n_batch;
    size_t HD = (size_t)hp->n_head * (size_t)hp->head_dim;
    f->x = alloc_f(f, B * (size_t)hp->n_embd);
    f->h = alloc_f(f, B * (size_t)hp->n_embd);
    f->o = alloc_f(f, B * (size_t)hp->n_embd);
    f->q = alloc_f(f, B * HD);
    f->att = alloc_f(f, B * HD);
    f->k = alloc_f(f, B * (size_t)kvd);
    f->v = alloc_f(f, B * (size_t)kvd);
    f->gate = alloc_f(f, B * (size_t)hp->n_ff);
    f->up = alloc_f(f, B * (size_t)hp->n_ff);
    f->logits = alloc_f(f, OUT_ROWS * (size_t)hp->n_vocab);
    f->pos = malloc(B * sizeof(int32_t));
    if (!f->x || !f->h || !f->o || !f->q || !f->att || !f->k || !f->v || !f->gate || !f->up || !f->logits ||
        !f->pos) {
        fwd_free(f);
        snprintf(err, errlen, "out of memory allocating forward buffers");
        return NULL;
    }
    return f;
}

void fwd_free(fwd_ctx *f)
{
    if (!f) return;
    kv_free(f->kv);
    free(f->x);
    free(f->h);
    free(f->o);
    free(f->q);
    free(f->att);
    free(f->k);
    free(f->v);
    free(f->gate);
    free(f->up);
    free(f->logits);
    free(f->pos);
    free(f);
}

int64_t fwd_pos(const fwd_ctx *f) { return kv_len(f->kv); }
int64_t fwd_n_ctx(const fwd_ctx *f) { return kv_n_ctx(f->kv); }
const kv_cache *fwd_kv(const fwd_ctx *f) { return f->kv; }
uint64_t fwd_scratch_bytes(const fwd_ctx *f) { return f->scratch_bytes; }

void fwd_rewind(fwd_ctx *f, int64_t pos)
{
    if (pos < kv_len(f->kv)) kv_set_len(f->kv, pos);
}

static void add_in_place(float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

/* One chunk of n tokens at positions p0 .. p0+n-1; leaves the final hidden states in f->x.
 * Returns -1 if *abort_flag was raised (checked before every layer, so Ctrl-C answers within a
 * layer's time even on long chunks); the caller then rewinds the cache. */
static int forward_chunk(fwd_ctx *f, const int32_t *tokens, int64_t n, int64_t p0, volatile sig_atomic_t *abort_flag)
{
    const model *m = f->m;
    const model_hparams *hp = &m->hp;
    const be_ops *op = f->b->ops;
    be_backend *b = f->b;
    int64_t E = hp->n_embd, D = hp->head_dim, H = hp->n_head, Hkv = hp->n_head_kv;
    int64_t kvd = Hkv * D;
    for (int64_t t = 0; t < n; t++) f->pos[t] = (int32_t)(p0 + t);

    op->get_rows(b, &m->tok_embd, tokens, n, hp->embd_scale, f->x);
    for (int il = 0; il < hp->n_layer; il++) {
        if (abort_flag && *abort_flag) return -1;
        const model_layer *ly = &m->layers[il];
        /* attention block */
        op->rmsnorm(b, f->x, ly->attn_norm, f->h, n, E, hp->norm_eps);
        be_mm qkv[3] = { { &ly->wq, f->q }, { &ly->wk, f->k }, { &ly->wv, f->v } };
        op->matmul(b, qkv, 3, f->h, n);
        if (hp->post_norms) {
            op->rmsnorm(b, f->q, ly->q_norm, f->q, n * H, D, hp->norm_eps);
            op->rmsnorm(b, f->k, ly->k_norm, f->k, n * Hkv, D, hp->norm_eps);
        }
        op->rope(b, f->q, n, (int)H, (int)D, f->pos, ly->rope_base, hp->rope_freq_scale, hp->rope_neox);
        op->rope(b, f->k, n, (int)Hkv, (int)D, f->pos, ly->rope_base, hp->rope_freq_scale, hp->rope_neox);
        for (int64_t i = 0; i < n * H * D; i++) f->q[i] *= hp->attn_scale;
        for (int64_t t = 0; t < n; t++) {
            memcpy(kv_k_row(f->kv, il, p0 + t), f->k + t * kvd, sizeof(float) * (size_t)kvd);
            memcpy(kv_v_row(f->kv, il, p0 + t), f->v + t * kvd, sizeof(float) * (size_t)kvd);
        }
        be_attn a = {
            .q = f->q, .n_q = n, .q_pos = f->pos, .n_head = (int)H, .n_head_kv = (int)Hkv, .head_dim = (int)D,
            .k = kv_k_base(f->kv, il), .v = kv_v_base(f->kv, il), .n_kv = p0 + n,
            .window = ly->is_swa ? hp->n_swa : 0, .out = f->att,
        };
        op->attention(b, &a);
        be_mm wo = { &ly->wo, f->o };
        op->matmul(b, &wo, 1, f->att, n);
        if (hp->post_norms) op->rmsnorm(b, f->o, ly->post_attn_norm, f->o, n, E, hp->norm_eps);
        add_in_place(f->x, f->o, (size_t)(n * E));
        /* feed-forward block */
        op->rmsnorm(b, f->x, ly->ffn_norm, f->h, n, E, hp->norm_eps);
        be_mm gu[2] = { { &ly->w_gate, f->gate }, { &ly->w_up, f->up } };
        op->matmul(b, gu, 2, f->h, n);
        op->glu(b, f->gate, f->up, n * hp->n_ff, hp->gelu);
        be_mm down = { &ly->w_down, f->o };
        op->matmul(b, &down, 1, f->gate, n);
        if (hp->post_norms) op->rmsnorm(b, f->o, ly->post_ffw_norm, f->o, n, E, hp->norm_eps);
        add_in_place(f->x, f->o, (size_t)(n * E));
    }
    return 0;
}

/* Logits for rows [r0, r0+nr) of the chunk's hidden states, into f->logits. */
static void output_rows(fwd_ctx *f, int64_t r0, int64_t nr)
{
    const model *m = f->m;
    const model_hparams *hp = &m->hp;
    int64_t E = hp->n_embd;
    f->b->ops->rmsnorm(f->b, f->x + r0 * E, m->output_norm, f->h, nr, E, hp->norm_eps);
    be_mm out = { &m->output, f->logits };
    f->b->ops->matmul(f->b, &out, 1, f->h, nr);
    if (hp->final_softcap > 0) {
        float c = hp->final_softcap;
        for (int64_t i = 0; i < nr * hp->n_vocab; i++) f->logits[i] = c * tanhf(f->logits[i] / c);
    }
}

int fwd_eval(fwd_ctx *f, const int32_t *tokens, int64_t n, float *logits_last, fwd_logits_fn each, void *ud,
             fwd_progress_fn progress, void *pud, volatile sig_atomic_t *abort_flag, char *err, size_t errlen)
{
    const model_hparams *hp = &f->m->hp;
    int64_t start = kv_len(f->kv);
    if (n <= 0) {
        snprintf(err, errlen, "nothing to evaluate");
        return -1;
    }
    if (start + n > kv_n_ctx(f->kv)) {
        snprintf(err, errlen, "%lld tokens do not fit in the context: %lld already used of %lld",
                 (long long)n, (long long)start, (long long)kv_n_ctx(f->kv));
        return -1;
    }
    for (int64_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab) {
            snprintf(err, errlen, "token id %d out of range (vocabulary has %d)", tokens[i], hp->n_vocab);
            return -1;
        }
    }
    for (int64_t c0 = 0; c0 < n; c0 += f->n_batch) {
        int64_t cn = n - c0 < f->n_batch ? n - c0 : f->n_batch;
        if ((abort_flag && *abort_flag) || forward_chunk(f, tokens + c0, cn, start + c0, abort_flag) != 0) {
            kv_set_len(f->kv, start);
            snprintf(err, errlen, "cancelled");
            return -1;
        }
        kv_set_len(f->kv, start + c0 + cn);
        if (each) {
            for (int64_t r = 0; r < cn; r += OUT_ROWS) {
                int64_t nr = cn - r < OUT_ROWS ? cn - r : OUT_ROWS;
                output_rows(f, r, nr);
                for (int64_t i = 0; i < nr; i++) each(ud, start + c0 + r + i, f->logits + i * hp->n_vocab);
            }
            if (logits_last && c0 + cn == n)
                memcpy(logits_last, f->logits + ((cn - 1) % OUT_ROWS) * hp->n_vocab,
                       sizeof(float) * (size_t)hp->n_vocab);
        } else if (logits_last && c0 + cn == n) {
            output_rows(f, cn - 1, 1);
            memcpy(logits_last, f->logits, sizeof(float) * (size_t)hp->n_vocab);
        }
        if (progress) progress(pud, c0 + cn, n);
    }
    return 0;
}
