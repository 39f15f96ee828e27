/* tokenizer.c - GGUF vocabularies tokenized through SentencePiece (see tokenizer.h).
 *
 * The ModelProto is written by hand in protobuf wire format (libsentencepiece-dev ships no proto
 * header): pieces with scores and types, a BPE trainer spec with byte fallback, and an identity
 * normalizer whose add_dummy_prefix follows tokenizer.ggml.add_space_prefix. Special-token texts are
 * split out here before SentencePiece sees the text, fragment by fragment, which reproduces the
 * reference tokenizer's "space prefix after every special token" rule. */
#include "engine/tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/files.h"
#include "engine/spm_shim.h"

/* A SentencePiece model file is a few MB (a 262K vocabulary: 4.5 MB); this bounds what --tokenizer reads. */
#define TOK_MODEL_MAX_BYTES ((size_t)256 << 20)

struct tok_vocab {
    int32_t n;
    char **piece;              /* NUL-terminated copies */
    uint32_t *piece_len;
    uint8_t *type;
    float *score;
    int32_t bos, eos, unk, eot;
    int add_bos, add_space_prefix;
    spm_proc *spm;
    /* special-token candidates bucketed by first byte, longest first within a bucket */
    int32_t *sp_ids;
    uint32_t sp_start[257];
    int32_t *sp_ids_all;       /* same with CONTROL/UNKNOWN included (parse_special) */
    uint32_t sp_all_start[257];
};

/* ---------------------------------------------------------------- protobuf writer */

typedef struct pbuf {
    uint8_t *p;
    size_t n, cap;
    int oom;
} pbuf;

static void pb_need(pbuf *b, size_t k)
{
    if (b->oom || b->n + k <= b->cap) return;
    size_t nc = (b->n + k) * 2 + 1024;
    uint8_t *np = realloc(b->p, nc);
    if (!np) {
        b->oom = 1;
        return;
    }
    b->p = np;
    b->cap = nc;
}

static void pb_varint(pbuf *b, uint64_t v)
{
    pb_need(b, 10);
    if (b->oom) return;
    do {
        uint8_t byte = v & 0x7F;
        v >>= 7;
        b->p[b->n++] = byte | (v ? 0x80 : 0);
    } while (v);
}

static void pb_key(pbuf *b, uint32_t field, uint32_t wire) { pb_varint(b, ((uint64_t)field << 3) | wire); }
static void pb_int(pbuf *b, uint32_t field, int64_t v)
{
    pb_key(b, field, 0);
    pb_varint(b, (uint64_t)v);  /* negative int32 sign-extends to 10 bytes, as protobuf does */
}

static void pb_bytes(pbuf *b, uint32_t field, const void *d, size_t n)
{
    pb_key(b, field, 2);
    pb_varint(b, n);
    pb_need(b, n);
    if (b->oom) return;
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void pb_float(pbuf *b, uint32_t field, float f)
{
    pb_key(b, field, 5);
    pb_need(b, 4);
    if (b->oom) return;
    memcpy(b->p + b->n, &f, 4);
    b->n += 4;
}

static size_t varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* ---------------------------------------------------------------- construction */

/* The SentencePiece ModelProto equivalent to the GGUF vocabulary:
 * 1 pieces {1 piece, 2 score, 3 type}, 2 trainer_spec, 3 normalizer_spec. */
static int build_proto(const tok_vocab *v, pbuf *pb)
{
    int n_byte = 0;
    for (int32_t i = 0; i < v->n; i++) {
        size_t body = 1 + varint_len(v->piece_len[i]) + v->piece_len[i] + 5 + 2;
        pb_key(pb, 1, 2);
        pb_varint(pb, body);
        pb_bytes(pb, 1, v->piece[i], v->piece_len[i]);
        pb_float(pb, 2, v->score[i]);
        pb_int(pb, 3, v->type[i]);
        n_byte += v->type[i] == TOK_BYTE;
    }
    pbuf ts = { 0 };
    pb_int(&ts, 3, 2);  /* model_type = BPE: merge by score, as the reference tokenizer does */
    pb_int(&ts, 4, v->n);
    pb_int(&ts, 35, n_byte >= 256);  /* byte_fallback */
    pb_int(&ts, 40, v->unk);
    pb_int(&ts, 41, v->bos);
    pb_int(&ts, 42, v->eos);
    pb_int(&ts, 43, -1);
    pbuf ns_ = { 0 };
    pb_bytes(&ns_, 1, "identity", 8);
    pb_int(&ns_, 3, v->add_space_prefix);
    pb_int(&ns_, 4, 0);  /* remove_extra_whitespaces defaults to true: must be written */
    pb_int(&ns_, 5, 1);
    int oom = ts.oom || ns_.oom;
    if (!oom) {
        pb_bytes(pb, 2, ts.p, ts.n);
        pb_bytes(pb, 3, ns_.p, ns_.n);
    }
    free(ts.p);
    free(ns_.p);
    return oom || pb->oom ? -1 : 0;
}

static int fail(char *err, size_t errlen, const char *msg)
{
    snprintf(err, errlen, "%s", msg);
    return -1;
}




static int by_first_byte_then_len(const tok_vocab *v, int32_t a, int32_t b)
{
    uint8_t fa = (uint8_t)v->piece[a][0], fb = (uint8_t)v->piece[b][0];
    if (fa != fb) return fa < fb ? -1 : 1;
    if (v->piece_len[a] != v->piece_len[b]) return v->piece_len[a] > v->piece_len[b] ? -1 : 1;
    return a < b ? -1 : a > b;
}

/* Small merge sort (qsort has no context argument in C11). */
static void sort_ids(const tok_vocab *v, int32_t *ids, int32_t *tmp, int32_t n)
{
    if (n < 2) return;
    int32_t h = n / 2;
    sort_ids(v, ids, tmp, h);
    sort_ids(v, ids + h, tmp, n - h);
    int32_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = by_first_byte_then_len(v, ids[i], ids[j]) <= 0 ? ids[i++] : ids[j++];
    while (i < h) tmp[k++] = ids[i++];
    while (j < n) tmp[k++] = ids[j++];
    memcpy(ids, tmp, sizeof(int32_t) * (size_t)n);
}

static int build_specials(tok_vocab *v, int with_control, int32_t **out, uint32_t *start)
{
    int32_t cnt = 0;
    for (int32_t i = 0; i < v->n; i++) {
        int t = v->type[i];
        if (v->piece_len[i] == 0) continue;
        if (t == TOK_USER_DEFINED || (with_control && (t == TOK_CONTROL || t == TOK_UNKNOWN))) cnt++;
    }
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(cnt ? cnt : 1));
    int32_t *tmp = malloc(sizeof(int32_t) * (size_t)(cnt ? cnt : 1));
    if (!ids || !tmp) {
        free(ids);
        free(tmp);
        return -1;
    }
    int32_t k = 0;
    for (int32_t i = 0; i < v->n; i++) {
        int t = v->type[i];
        if (v->piece_len[i] == 0) continue;
        if (t == TOK_USER_DEFINED || (with_control && (t == TOK_CONTROL || t == TOK_UNKNOWN))) ids[k++] = i;
    }
    sort_ids(v, ids, tmp, cnt);
    free(tmp);
    /* start[b] .. start[b+1] is the bucket of first byte b */
    int32_t j = 0;
    for (int b = 0; b < 256; b++) {
        start[b] = (uint32_t)j;
        while (j < cnt && (uint8_t)v->piece[ids[j]][0] == b) j++;
    }
    start[256] = (uint32_t)cnt;
    *out = ids;
    return 0;
}

static int read_id(const gguf_file *f, const char *key, int32_t dflt, int32_t n, int32_t *out)
{
    int64_t v;
    int rc = gguf_get_i64(f, key, &v);
    if (rc == -1) {
        *out = dflt;
        return 0;
    }
    if (rc != 0 || v < -1 || v >= n) return -1;
    *out = (int32_t)v;
    return 0;
}

int tok_create(tok_vocab **out, const gguf_file *f, const char *spm_model_path, char *err, size_t errlen)
{
    *out = NULL;
    gguf_str model_name;
    if (gguf_get_str(f, "tokenizer.ggml.model", &model_name) != 0)
        return fail(err, errlen, "no tokenizer in the file (tokenizer.ggml.model missing)");
    if (!gguf_str_eq(model_name, "llama"))
        return snprintf(err, errlen, "tokenizer model '%.*s' is not supported (kvchat runs SentencePiece 'llama' vocabularies)",
                        (int)(model_name.len > 40 ? 40 : model_name.len), model_name.ptr),
               -1;
    enum gguf_vtype et;
    uint64_t n;
    const void *data;
    if (gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &n, &data) != 0 || et != GGUF_VT_STRING)
        return fail(err, errlen, "tokenizer.ggml.tokens missing or not a string array");
    if (n == 0 || n > (1u << 24)) return fail(err, errlen, "tokenizer.ggml.tokens has an implausible size");
    uint64_t ns, nt;
    const void *sdata, *tdata;
    enum gguf_vtype set, tet;
    if (gguf_get_arr(f, "tokenizer.ggml.scores", &set, &ns, &sdata) != 0 || ns != n || set != GGUF_VT_FLOAT32)
        return fail(err, errlen, "tokenizer.ggml.scores missing or of the wrong size");
    if (gguf_get_arr(f, "tokenizer.ggml.token_type", &tet, &nt, &tdata) != 0 || nt != n)
        return fail(err, errlen, "tokenizer.ggml.token_type missing or of the wrong size");
    tok_vocab *v = calloc(1, sizeof *v);
    if (!v) return fail(err, errlen, "out of memory");
    v->n = (int32_t)n;
    v->piece = calloc(n, sizeof *v->piece);
    v->piece_len = calloc(n, sizeof *v->piece_len);
    v->type = calloc(n, 1);
    v->score = calloc(n, sizeof *v->score);
    pbuf pb = { 0 };
    if (!v->piece || !v->piece_len || !v->type || !v->score) goto oom;
    if (read_id(f, "tokenizer.ggml.bos_token_id", 1, v->n, &v->bos) ||
        read_id(f, "tokenizer.ggml.eos_token_id", 2, v->n, &v->eos) ||
        read_id(f, "tokenizer.ggml.unknown_token_id", 0, v->n, &v->unk) ||
        read_id(f, "tokenizer.ggml.eot_token_id", -1, v->n, &v->eot)) {
        tok_free(v);
        return fail(err, errlen, "a special token id (bos/eos/unk/eot) is out of range");
    }
    int b;
    v->add_bos = gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &b) == 0 ? b : 1;
    v->add_space_prefix = gguf_get_bool(f, "tokenizer.ggml.add_space_prefix", &b) == 0 ? b : 1;
    for (uint64_t i = 0; i < n; i++) {
        gguf_str s;
        int64_t t;
        gguf_arr_str(f, "tokenizer.ggml.tokens", i, &s);
        if (gguf_arr_i64(f, "tokenizer.ggml.token_type", i, &t) != 0) {
            tok_free(v);
            return fail(err, errlen, "tokenizer.ggml.token_type is not an integer array");
        }
        if (s.len > 65535) {
            tok_free(v);
            return fail(err, errlen, "a vocabulary piece is longer than 64 KiB");
        }
        v->piece[i] = malloc(s.len + 1);
        if (!v->piece[i]) goto oom;
        memcpy(v->piece[i], s.ptr, s.len);
        v->piece[i][s.len] = 0;
        v->piece_len[i] = (uint32_t)s.len;
        v->type[i] = (t >= 1 && t <= 6) ? (uint8_t)t : TOK_NORMAL;
        memcpy(&v->score[i], (const uint8_t *)sdata + i * 4, 4);
    }
    if (v->unk >= 0) v->type[v->unk] = TOK_UNKNOWN;  /* SentencePiece requires an UNKNOWN piece */
    if (v->eot < 0) {
        const char *names[] = { "<end_of_turn>", "<|eot_id|>", "<|im_end|>" };
        for (int k = 0; k < 3 && v->eot < 0; k++) v->eot = tok_find(v, names[k]);
    }
    if (spm_model_path) {
        /* through the checked open: a FIFO or a device named as the tokenizer is refused at once */
        size_t nb;
        char *bytes = files_read_all(spm_model_path, TOK_MODEL_MAX_BYTES, "a SentencePiece model file", &nb, err,
                                     errlen);
        if (!bytes) {
            tok_free(v);
            return -1;
        }
        char e[400];
        v->spm = spm_load_proto(bytes, nb, e, sizeof e);
        free(bytes);
        if (!v->spm) {
            snprintf(err, errlen, "%s: %s", spm_model_path, e);
            tok_free(v);
            return -1;
        }
        if (spm_piece_size(v->spm) != v->n) {
            snprintf(err, errlen, "%s has %d pieces but the model's vocabulary has %d", spm_model_path,
                     spm_piece_size(v->spm), v->n);
            tok_free(v);
            return -1;
        }
    } else {
        if (build_proto(v, &pb) != 0) goto oom;
        v->spm = spm_load_proto(pb.p, pb.n, err, errlen);
        free(pb.p);
        pb.p = NULL;
        if (!v->spm) {
            tok_free(v);
            return -1;
        }
    }
    if (build_specials(v, 0, &v->sp_ids, v->sp_start) || build_specials(v, 1, &v->sp_ids_all, v->sp_all_start))
        goto oom;
    *out = v;
    return 0;
oom:
    free(pb.p);
    tok_free(v);
    return fail(err, errlen, "out of memory building the tokenizer");
}

void tok_free(tok_vocab *v)
{
    if (!v) return;
    if (v->piece)
        for (int32_t i = 0; i < v->n; i++) free(v->piece[i]);
    free(v->piece);
    free(v->piece_len);
    free(v->type);
    free(v->score);
    free(v->sp_ids);
    free(v->sp_ids_all);
    spm_free(v->spm);
    free(v);
}

int tok_export_model(const tok_vocab *v, const char *path, char *err, size_t errlen)
{
    pbuf pb = { 0 };
    if (build_proto(v, &pb) != 0) {
        free(pb.p);
        return fail(err, errlen, "out of memory");
    }
    /* replaced whole through a new file (a link at path is replaced, never followed; a device or
     * FIFO there is refused) */
    files_atomic fa;
    int rc = files_atomic_open(&fa, path, err, errlen);
    if (rc == 0) {
        if (fwrite(pb.p, 1, pb.n, fa.f) == pb.n) {
            rc = files_atomic_commit(&fa, err, errlen);
        } else {
            snprintf(err, errlen, "%s: cannot write the tokenizer model: %s", path, strerror(errno ? errno : EIO));
            files_atomic_abort(&fa);
            rc = -1;
        }
    }
    free(pb.p);
    return rc ? -1 : 0;
}

int32_t tok_n_vocab(const tok_vocab *v) { return v->n; }
int32_t tok_bos(const tok_vocab *v) { return v->bos; }
int32_t tok_eos(const tok_vocab *v) { return v->eos; }
int32_t tok_eot(const tok_vocab *v) { return v->eot; }
int tok_add_bos(const tok_vocab *v) { return v->add_bos; }
int tok_is_eog(const tok_vocab *v, int32_t id) { return id >= 0 && (id == v->eos || id == v->eot); }
enum tok_type tok_type_of(const tok_vocab *v, int32_t id) { return (enum tok_type)v->type[id]; }
const char *tok_piece(const tok_vocab *v, int32_t id) { return id >= 0 && id < v->n ? v->piece[id] : ""; }

int32_t tok_find(const tok_vocab *v, const char *text)
{
    size_t n = strlen(text);
    for (int32_t i = 0; i < v->n; i++)
        if (v->piece_len[i] == n && !memcmp(v->piece[i], text, n)) return i;
    return -1;
}

/* ---------------------------------------------------------------- UTF-8 */

/* Length of the valid UTF-8 sequence at s (at most n bytes), or 0 if invalid there. */
static int utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) { len = 3; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) len = 3;
    else if (c == 0xED) { len = 3; hi = 0x9F; }
    else if (c >= 0xEE && c <= 0xEF) len = 3;
    else if (c == 0xF0) { len = 4; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) { len = 4; hi = 0x8F; }
    else return 0;
    if ((size_t)len > n) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return len;
}

int64_t tok_utf8_invalid_at(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        int k = utf8_seq(u + i, len - i);
        if (!k) return (int64_t)i;
        i += (size_t)k;
    }
    return -1;
}

/* ---------------------------------------------------------------- encode */

typedef struct idvec {
    int32_t *p;
    size_t n, cap;
} idvec;

static int push(idvec *v, int32_t id)
{
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 64;
        int32_t *np = realloc(v->p, nc * sizeof *np);
        if (!np) return -1;
        v->p = np;
        v->cap = nc;
    }
    v->p[v->n++] = id;
    return 0;
}

int tok_encode(const tok_vocab *v, const char *text, size_t len, int add_bos, int parse_special, int32_t **ids,
               size_t *n, char *err, size_t errlen)
{
    *ids = NULL;
    *n = 0;
    int64_t bad = tok_utf8_invalid_at(text, len);
    if (bad >= 0) {
        snprintf(err, errlen, "invalid UTF-8 at byte %lld", (long long)bad);
        return -1;
    }
    idvec out = { 0 };
    if (add_bos && v->bos >= 0 && push(&out, v->bos)) goto oom;
    const int32_t *sp = parse_special ? v->sp_ids_all : v->sp_ids;
    const uint32_t *st = parse_special ? v->sp_all_start : v->sp_start;
    size_t frag = 0, i = 0;
    while (i <= len) {
        int32_t hit = -1;
        if (i < len) {
            uint8_t c = (uint8_t)text[i];
            for (uint32_t k = st[c]; k < st[c + 1]; k++) {
                int32_t id = sp[k];
                if (v->piece_len[id] <= len - i && !memcmp(text + i, v->piece[id], v->piece_len[id])) {
                    hit = id;
                    break;
                }
            }
        }
        if (hit >= 0 || i == len) {
            if (i > frag &&
                spm_encode(v->spm, text + frag, i - frag, &out.p, &out.n, &out.cap, err, errlen) != 0) {
                free(out.p);
                return -1;
            }
            if (hit < 0) break;
            if (push(&out, hit)) goto oom;
            i += v->piece_len[hit];
            frag = i;
        } else {
            i++;
        }
    }
    *ids = out.p;
    *n = out.n;
    return 0;
oom:
    free(out.p);
    snprintf(err, errlen, "out of memory");
    return -1;
}

/* ---------------------------------------------------------------- decode */

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

int tok_find_text(const tok_vocab *v, const int32_t *ids, size_t n, const char *text, int64_t *lo, int64_t *hi)
{
    size_t tl = strlen(text), len = 0, cap = 0;
    if (tl == 0) return -1;
    char *all = NULL;
    size_t *start = malloc(sizeof(size_t) * (n + 1));   /* each token's first byte in all */
    if (!start) return -1;
    for (size_t i = 0; i < n; i++) {
        char piece[256];
        size_t w = tok_piece_text(v, ids[i], 0, piece, sizeof piece);
        if (w > sizeof piece) w = sizeof piece;
        if (len + w + 1 > cap) {
            cap = (len + w + 1) * 2;
            char *na = realloc(all, cap);
            if (!na) {
                free(all);
                free(start);
                return -1;
            }
            all = na;
        }
        start[i] = len;
        memcpy(all + len, piece, w);
        len += w;
    }
    start[n] = len;
    int rc = -1;
    const char *at = all ? memmem(all, len, text, tl) : NULL;
    if (at) {
        size_t a = (size_t)(at - all), b = a + tl;
        size_t i = 0;
        while (i + 1 < n && start[i + 1] <= a) i++;
        size_t j = i;
        while (j < n && start[j] < b) j++;
        *lo = (int64_t)i;
        *hi = (int64_t)j;
        rc = 0;
    }
    free(all);
    free(start);
    return rc;
}

size_t tok_piece_text(const tok_vocab *v, int32_t id, int render_special, char *buf, size_t cap)
{
    if (id < 0 || id >= v->n) return 0;
    const char *p = v->piece[id];
    size_t pl = v->piece_len[id], w = 0;
#define PUT(ch) do { if (w < cap) buf[w] = (char)(ch); w++; } while (0)
    switch (v->type[id]) {
    case TOK_BYTE:
        if (pl == 6 && p[0] == '<' && p[1] == '0' && p[2] == 'x' && p[5] == '>' && hexval(p[3]) >= 0 && hexval(p[4]) >= 0) {
            PUT(hexval(p[3]) * 16 + hexval(p[4]));
            return w;
        }
        break;
    case TOK_CONTROL:
    case TOK_UNKNOWN:
    case TOK_UNUSED:
        if (!render_special) return 0;
        for (size_t i = 0; i < pl; i++) PUT(p[i]);
        return w;
    case TOK_USER_DEFINED:
        for (size_t i = 0; i < pl; i++) PUT(p[i]);
        return w;
    default:
        break;
    }
    for (size_t i = 0; i < pl; i++) {
        if (i + 2 < pl && (uint8_t)p[i] == 0xE2 && (uint8_t)p[i + 1] == 0x96 && (uint8_t)p[i + 2] == 0x81) {
            PUT(' ');
            i += 2;
        } else {
            PUT(p[i]);
        }
    }
#undef PUT
    return w;
}

static const char REPLACEMENT[] = "\xEF\xBF\xBD";

typedef struct sbuf {
    char *out;
    size_t cap, n;
} sbuf;

static void sb_put(sbuf *b, const void *d, size_t k)
{
    for (size_t i = 0; i < k; i++) {
        if (b->n + 1 < b->cap) b->out[b->n] = ((const char *)d)[i];
        b->n++;
    }
}

/* Feed bytes through the UTF-8 assembler of s, emitting only whole characters. */
static void stream_bytes(tok_stream *s, const unsigned char *d, size_t k, sbuf *b)
{
    for (size_t i = 0; i < k; i++) {
        unsigned char c = d[i];
        if (s->npend == 0) {
            if (c < 0x80) {
                sb_put(b, &c, 1);
            } else if (c >= 0xC2 && c <= 0xF4) {
                s->pend[s->npend++] = c;
            } else {
                sb_put(b, REPLACEMENT, 3);
            }
            continue;
        }
        if (c >= 0x80 && c <= 0xBF) {
            s->pend[s->npend++] = c;
            int need = s->pend[0] >= 0xF0 ? 4 : s->pend[0] >= 0xE0 ? 3 : 2;
            if (s->npend == need) {
                if (utf8_seq(s->pend, (size_t)need) == need) sb_put(b, s->pend, (size_t)need);
                else sb_put(b, REPLACEMENT, 3);
                s->npend = 0;
            }
            continue;
        }
        /* a sequence cut short by a non-continuation byte */
        sb_put(b, REPLACEMENT, 3);
        s->npend = 0;
        i--;  /* reprocess c as the start of something new */
    }
}

void tok_stream_init(tok_stream *s, const tok_vocab *v)
{
    memset(s, 0, sizeof *s);
    s->v = v;
    s->first = 1;
}

size_t tok_stream_feed(tok_stream *s, int32_t id, char *out, size_t cap)
{
    char tmp[1024];
    size_t k = tok_piece_text(s->v, id, 0, tmp, sizeof tmp);
    if (k > sizeof tmp) k = sizeof tmp;
    const char *p = tmp;
    if (k > 0 && s->first) {
        s->first = 0;
        /* SentencePiece drops the space its dummy prefix added in front of the first piece. */
        if (s->v->add_space_prefix && p[0] == ' ') {
            p++;
            k--;
        }
    }
    sbuf b = { out, cap, 0 };
    stream_bytes(s, (const unsigned char *)p, k, &b);
    size_t w = b.n < cap ? b.n : (cap ? cap - 1 : 0);
    if (cap) out[w] = 0;
    return w;
}

size_t tok_stream_flush(tok_stream *s, char *out, size_t cap)
{
    sbuf b = { out, cap, 0 };
    if (s->npend) sb_put(&b, REPLACEMENT, 3);
    s->npend = 0;
    size_t w = b.n < cap ? b.n : (cap ? cap - 1 : 0);
    if (cap) out[w] = 0;
    return w;
}

char *tok_decode(const tok_vocab *v, const int32_t *ids, size_t n)
{
    size_t cap = 64;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < v->n) cap += v->piece_len[ids[i]] + 4;
    char *out = malloc(cap);
    if (!out) return NULL;
    tok_stream s;
    tok_stream_init(&s, v);
    size_t w = 0;
    for (size_t i = 0; i < n; i++) w += tok_stream_feed(&s, ids[i], out + w, cap - w);
    w += tok_stream_flush(&s, out + w, cap - w);
    out[w] = 0;
    return out;
}
