/* model.c - turn a GGUF file into a model: hyperparameters, weight views, tokenizer.
 *
 * Metadata keys and tensor names follow ../shared/docs/model-facts.md sections 1.5 and 2; defaults for
 * absent keys are the ones the reference implementation uses, so files load the same way there and
 * here. Weights are not copied: be_weight points into the read-only mapping. */
#include "engine/model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>

#include "common/files.h"
#include "common/quant.h"

typedef struct loader {
    model *m;
    const char *path;
    char *err;
    size_t errlen;
} loader;

static int fail(loader *L, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(L->err, L->errlen, "%s: %s", L->path, msg);
    return -1;
}

/* arch-prefixed key, e.g. "gemma3.embedding_length" */
static const char *akey(loader *L, const char *suffix, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s.%s", L->m->arch_name, suffix);
    return buf;
}

static int get_u32(loader *L, const char *suffix, int required, uint32_t dflt, int32_t *out)
{
    char k[160];
    uint32_t v;
    int rc = gguf_get_u32(L->m->gguf, akey(L, suffix, k, sizeof k), &v);
    if (rc == -1) {
        if (required) return fail(L, "missing metadata key %s", k);
        v = dflt;
    } else if (rc != 0) {
        /* Some producers store per-layer arrays; kvchat needs one value for every layer. */
        enum gguf_vtype et;
        uint64_t n;
        const void *d;
        if (gguf_get_arr(L->m->gguf, k, &et, &n, &d) == 0 && n > 0) {
            int64_t first, x;
            if (gguf_arr_i64(L->m->gguf, k, 0, &first) != 0)
                return fail(L, "metadata key %s has an unusable type", k);
            for (uint64_t i = 1; i < n; i++)
                if (gguf_arr_i64(L->m->gguf, k, i, &x) != 0 || x != first)
                    return fail(L, "metadata key %s varies per layer, which kvchat does not support", k);
            if (first < 0 || first > INT32_MAX) return fail(L, "metadata key %s out of range", k);
            v = (uint32_t)first;
        } else {
            return fail(L, "metadata key %s has an unusable type", k);
        }
    }
    if (v > INT32_MAX) return fail(L, "metadata key %s out of range (%u)", k, v);
    *out = (int32_t)v;
    return 0;
}

static int get_f32(loader *L, const char *suffix, int required, float dflt, float *out)
{
    char k[160];
    int rc = gguf_get_f32(L->m->gguf, akey(L, suffix, k, sizeof k), out);
    if (rc == -1) {
        if (required) return fail(L, "missing metadata key %s", k);
        *out = dflt;
        return 0;
    }
    if (rc != 0) return fail(L, "metadata key %s is not a float", k);
    if (!isfinite(*out)) return fail(L, "metadata key %s is not finite", k);
    return 0;
}

/* A float hyperparameter that must lie in (lo, hi] (lo_closed: [lo, hi]): out of range, the model
 * would load and compute NaN logits (a RoPE base of 0 or -1, a negative norm epsilon), so it is
 * refused by name. */
static int get_f32_in(loader *L, const char *suffix, int required, float dflt, double lo, int lo_closed, double hi,
                      float *out)
{
    if (get_f32(L, suffix, required, dflt, out)) return -1;
    if ((lo_closed ? *out >= lo : *out > lo) && *out <= hi) return 0;
    char k[160];
    return fail(L, "metadata key %s is %g, out of range (%s %g, at most %g)", akey(L, suffix, k, sizeof k),
                (double)*out, lo_closed ? "at least" : "more than", lo, hi);
}

static const gguf_tensor *find(loader *L, const char *name)
{
    return gguf_find_tensor(L->m->gguf, name);
}

/* A 2-D weight with ne = [n_in, n_out], of a type kvchat can multiply. */
static int load_weight(loader *L, const char *name, int64_t n_in, int64_t n_out, be_weight *w)
{
    const gguf_tensor *t = find(L, name);
    if (!t) return fail(L, "missing tensor %s", name);
    if (t->n_dims > 2 || t->ne[0] != n_in || t->ne[1] != n_out)
        return fail(L, "tensor %s has shape [%lld, %lld], expected [%lld, %lld]", name, (long long)t->ne[0],
                    (long long)t->ne[1], (long long)n_in, (long long)n_out);
    if (!quant_supported(t->type))
        return fail(L, "tensor %s has type %s, which kvchat does not support", name, quant_type_name(t->type));
    w->data = t->data;
    w->type = t->type;
    w->n_in = n_in;
    w->n_out = n_out;
    w->row_bytes = quant_row_size(t->type, n_in);
    L->m->weight_bytes += t->nbytes;
    return 0;
}

/* A 1-D norm weight, converted to an owned f32 array. */
static int load_vec(loader *L, const char *name, int64_t n, float **out)
{
    const gguf_tensor *t = find(L, name);
    if (!t) return fail(L, "missing tensor %s", name);
    if (t->ne[0] != n || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1)
        return fail(L, "tensor %s has %lld elements, expected %lld", name, (long long)(t->ne[0] * t->ne[1]),
                    (long long)n);
    if (!quant_supported(t->type))
        return fail(L, "tensor %s has type %s, which kvchat does not support", name, quant_type_name(t->type));
    *out = malloc(sizeof(float) * (size_t)n);
    if (!*out) return fail(L, "out of memory");
    quant_dequant_row(t->type, t->data, *out, n);
    L->m->weight_bytes += t->nbytes;
    return 0;
}

static int read_hparams(loader *L)
{
    model *m = L->m;
    model_hparams *hp = &m->hp;
    gguf_file *f = m->gguf;
    if (get_u32(L, "embedding_length", 1, 0, &hp->n_embd)) return -1;
    if (get_u32(L, "block_count", 1, 0, &hp->n_layer)) return -1;
    if (get_u32(L, "feed_forward_length", 1, 0, &hp->n_ff)) return -1;
    if (get_u32(L, "attention.head_count", 1, 0, &hp->n_head)) return -1;
    if (get_u32(L, "context_length", 0, 4096, &hp->n_ctx_train)) return -1;
    if (hp->n_ctx_train <= 0) return fail(L, "context_length 0: the model names no context it was trained for");
    if (hp->n_embd <= 0 || hp->n_layer <= 0 || hp->n_ff <= 0 || hp->n_head <= 0)
        return fail(L, "invalid hyperparameters (embedding %d, layers %d, ffn %d, heads %d)", hp->n_embd,
                    hp->n_layer, hp->n_ff, hp->n_head);
    if (hp->n_layer > 1024 || hp->n_head > 1024 || hp->n_embd > 65536)
        return fail(L, "implausible hyperparameters (layers %d, heads %d, embedding %d)", hp->n_layer, hp->n_head,
                    hp->n_embd);
    if (get_u32(L, "attention.head_count_kv", 0, (uint32_t)hp->n_head, &hp->n_head_kv)) return -1;
    if (hp->n_head_kv <= 0 || hp->n_head % hp->n_head_kv != 0)
        return fail(L, "head_count %d is not a multiple of head_count_kv %d", hp->n_head, hp->n_head_kv);
    int32_t kl, vl, rot;
    if (get_u32(L, "attention.key_length", 0, (uint32_t)(hp->n_embd / hp->n_head), &kl)) return -1;
    if (get_u32(L, "attention.value_length", 0, (uint32_t)kl, &vl)) return -1;
    if (kl != vl) return fail(L, "key_length %d != value_length %d is not supported", kl, vl);
    if (kl <= 0 || kl % 2 != 0 || kl > 1024) return fail(L, "unsupported head size %d", kl);
    hp->head_dim = kl;
    if (get_u32(L, "rope.dimension_count", 0, (uint32_t)kl, &rot)) return -1;
    if (rot != kl) return fail(L, "partial rotary embeddings (%d of %d dims) are not supported", rot, kl);
    /* a RoPE base at or below 1 gives no rotation that falls with the dimension (0 or less: NaN);
     * real models use 1e4 to 1e7 */
    if (get_f32_in(L, "rope.freq_base", 0, 10000.0f, 1.0, 0, 1e12, &hp->rope_base)) return -1;
    if (get_f32_in(L, "rope.freq_base_swa", 0, 10000.0f, 1.0, 0, 1e12, &hp->rope_base_swa)) return -1;
    float factor;   /* 0: no scaling */
    if (get_f32_in(L, "rope.scaling.factor", 0, 0.0f, 0.0, 1, 1e6, &factor)) return -1;
    if (factor == 0.0f && get_f32_in(L, "rope.scale_linear", 0, 0.0f, 0.0, 1, 1e6, &factor)) return -1;
    hp->rope_freq_scale = factor > 0.0f ? 1.0f / factor : 1.0f;
    {
        char k[160];
        gguf_str st;
        if (gguf_get_str(f, akey(L, "rope.scaling.type", k, sizeof k), &st) == 0 && !gguf_str_eq(st, "linear") &&
            !gguf_str_eq(st, "none"))
            return fail(L, "RoPE scaling type '%.*s' is not supported", (int)st.len, st.ptr);
    }
    /* epsilon: 1e-6 or 1e-5 in real models; 0 or less divides by zero on a zero row or takes a root of
     * a negative number */
    if (get_f32_in(L, "attention.layer_norm_rms_epsilon", 1, 0, 0.0, 0, 1.0, &hp->norm_eps)) return -1;
    if (get_f32_in(L, "final_logit_softcapping", 0, 0.0f, 0.0, 1, 1e6, &hp->final_softcap)) return -1;   /* 0: none */
    hp->n_vocab = tok_n_vocab(m->vocab);
    if (hp->arch == ARCH_GEMMA3) {
        if (get_u32(L, "attention.sliding_window", 0, 0, &hp->n_swa)) return -1;
        if (get_u32(L, "attention.sliding_window_pattern", 0, 6, &hp->swa_pattern)) return -1;
        if (hp->swa_pattern <= 0) hp->swa_pattern = 6;
        hp->embd_scale = sqrtf((float)hp->n_embd);
        hp->rope_neox = 1;
        hp->gelu = 1;
        hp->post_norms = 1;
    } else {
        hp->n_swa = 0;
        hp->swa_pattern = 0;
        hp->embd_scale = 1.0f;
        hp->rope_neox = 0;
        hp->gelu = 0;
        hp->post_norms = 0;
    }
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    return 0;
}

static int load_tensors(loader *L)
{
    model *m = L->m;
    model_hparams *hp = &m->hp;
    int64_t E = hp->n_embd, D = hp->head_dim, F = hp->n_ff, V = hp->n_vocab;
    int64_t HD = (int64_t)hp->n_head * D, KD = (int64_t)hp->n_head_kv * D;
    if (load_weight(L, "token_embd.weight", E, V, &m->tok_embd)) return -1;
    if (load_vec(L, "output_norm.weight", E, &m->output_norm)) return -1;
    if (find(L, "output.weight")) {
        if (load_weight(L, "output.weight", E, V, &m->output)) return -1;
    } else {
        m->output = m->tok_embd;  /* tied embeddings */
    }
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) return fail(L, "out of memory");
    for (int il = 0; il < hp->n_layer; il++) {
        model_layer *ly = &m->layers[il];
        char n[96];
#define T(suffix) (snprintf(n, sizeof n, "blk.%d.%s.weight", il, suffix), n)
        if (load_vec(L, T("attn_norm"), E, &ly->attn_norm)) return -1;
        if (load_weight(L, T("attn_q"), E, HD, &ly->wq)) return -1;
        if (load_weight(L, T("attn_k"), E, KD, &ly->wk)) return -1;
        if (load_weight(L, T("attn_v"), E, KD, &ly->wv)) return -1;
        if (load_weight(L, T("attn_output"), HD, E, &ly->wo)) return -1;
        if (load_vec(L, T("ffn_norm"), E, &ly->ffn_norm)) return -1;
        if (load_weight(L, T("ffn_gate"), E, F, &ly->w_gate)) return -1;
        if (load_weight(L, T("ffn_up"), E, F, &ly->w_up)) return -1;
        if (load_weight(L, T("ffn_down"), F, E, &ly->w_down)) return -1;
        if (hp->post_norms) {
            if (load_vec(L, T("attn_q_norm"), D, &ly->q_norm)) return -1;
            if (load_vec(L, T("attn_k_norm"), D, &ly->k_norm)) return -1;
            if (load_vec(L, T("post_attention_norm"), E, &ly->post_attn_norm)) return -1;
            if (load_vec(L, T("post_ffw_norm"), E, &ly->post_ffw_norm)) return -1;
        }
#undef T
        /* Gemma 3: layer il is sliding-window unless (il + 1) is a multiple of the pattern. */
        ly->is_swa = hp->n_swa > 0 && (il % hp->swa_pattern) < hp->swa_pattern - 1;
        ly->rope_base = ly->is_swa ? hp->rope_base_swa : hp->rope_base;
    }
    return 0;
}

int model_load(model **out, const char *path, const model_load_opts *opts, char *err, size_t errlen)
{
    *out = NULL;
    model *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    loader L = { m, path, err, errlen };
    m->path = strdup(path);
    if (!m->path) goto oom;
    if (gguf_open(&m->gguf, path, err, errlen) != 0) goto fail;
    gguf_str arch;
    if (gguf_get_str(m->gguf, "general.architecture", &arch) != 0) {
        fail(&L, "missing metadata key general.architecture");
        goto fail;
    }
    if (gguf_str_eq(arch, "gemma3")) {
        m->hp.arch = ARCH_GEMMA3;
    } else if (gguf_str_eq(arch, "llama")) {
        m->hp.arch = ARCH_LLAMA;
    } else {
        fail(&L, "architecture '%.*s' is not supported (kvchat runs gemma3 and llama)",
             (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
        goto fail;
    }
    snprintf(m->arch_name, sizeof m->arch_name, "%.*s", (int)arch.len, arch.ptr);
    gguf_str nm;
    if (gguf_get_str(m->gguf, "general.name", &nm) == 0)
        snprintf(m->name, sizeof m->name, "%.*s", (int)(nm.len > 120 ? 120 : nm.len), nm.ptr);
    {
        char terr[400];
        if (tok_create(&m->vocab, m->gguf, opts ? opts->tokenizer_path : NULL, terr, sizeof terr) != 0) {
            fail(&L, "tokenizer: %s", terr);
            goto fail;
        }
    }
    if (read_hparams(&L) != 0) goto fail;
    if (load_tensors(&L) != 0) goto fail;
    *out = m;
    return 0;
oom:
    snprintf(err, errlen, "%s: out of memory", path);
fail:
    model_free(m);
    return -1;
}

int model_matmul_weights(const model *m, const be_weight **out, int cap)
{
    int n = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        const model_layer *L = &m->layers[il];
        const be_weight *lw[] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down };
        for (int i = 0; i < 7; i++, n++)
            if (n < cap) out[n] = lw[i];
    }
    if (n < cap) out[n] = &m->output;
    return n + 1;
}

int model_constants(const model *m, be_range *out, int cap)
{
    const size_t e = sizeof(float) * (size_t)m->hp.n_embd, d = sizeof(float) * (size_t)m->hp.head_dim;
    int n = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        const model_layer *L = &m->layers[il];
        const be_range lv[] = { { L->attn_norm, e }, { L->ffn_norm, e }, { L->q_norm, d },
                                { L->k_norm, d },    { L->post_attn_norm, e }, { L->post_ffw_norm, e } };
        for (int i = 0; i < 6; i++)
            if (lv[i].p) {
                if (n < cap) out[n] = lv[i];
                n++;
            }
    }
    if (n < cap) out[n] = (be_range){ m->output_norm, e };
    return n + 1;
}

void model_free(model *m)
{
    if (!m) return;
    if (m->layers) {
        for (int il = 0; il < m->hp.n_layer; il++) {
            model_layer *ly = &m->layers[il];
            free(ly->attn_norm);
            free(ly->ffn_norm);
            free(ly->q_norm);
            free(ly->k_norm);
            free(ly->post_attn_norm);
            free(ly->post_ffw_norm);
        }
        free(m->layers);
    }
    free(m->output_norm);
    tok_free(m->vocab);
    gguf_free(m->gguf);
    free(m->path);
    free(m);
}

static uint64_t fnv1a(uint64_t h, const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

int model_fingerprint(const char *path, char out[17], char *err, size_t errlen)
{
    FILE *f = files_open_read(path, UINT64_MAX, "a model file", err, errlen);
    if (!f) return -1;
    enum { SPAN = 1 << 20 };
    unsigned char *buf = malloc(SPAN);
    int64_t size = -1;
    if (buf && fseeko(f, 0, SEEK_END) == 0) size = (int64_t)ftello(f);
    uint64_t h = 0xcbf29ce484222325ULL;
    int ok = buf && size >= 0;
    if (ok) {
        h = fnv1a(h, (const unsigned char *)&size, sizeof size);
        int64_t tail = size > SPAN ? size - SPAN : 0;
        size_t n1 = 0, n2 = 0;
        ok = fseeko(f, 0, SEEK_SET) == 0 && (n1 = fread(buf, 1, SPAN, f), 1);
        h = fnv1a(h, buf, n1);
        ok = ok && fseeko(f, (off_t)tail, SEEK_SET) == 0 && (n2 = fread(buf, 1, SPAN, f), 1) && !ferror(f);
        h = fnv1a(h, buf, n2);
    }
    free(buf);
    fclose(f);
    if (!ok) {
        snprintf(err, errlen, "cannot read %s", path);
        return -1;
    }
    snprintf(out, 17, "%016llx", (unsigned long long)h);
    return 0;
}
