/* gguf_write.c - GGUF writer (see gguf_write.h).
 *
 * Layout written (model-facts section 1.1): magic, version 3, tensor and metadata counts, the
 * metadata records, the tensor records with offsets relative to the data section, padding to the
 * alignment, then each tensor's bytes padded to the alignment. The header is assembled in memory;
 * the data goes straight to the file through stdio's buffer. */
#include "engine/gguf_write.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/files.h"
#include "common/quant.h"
#include "engine/bytes.h"

typedef struct w_tensor {
    char *name;
    int n_dims;
    int64_t ne[4];
    uint32_t type;
    uint64_t nbytes, offset;
} w_tensor;

struct gguf_writer {
    uint32_t alignment;
    bytes_w kv;              /* the metadata records, serialized */
    int64_t n_kv;
    char **keys;             /* for duplicate checks */
    int64_t cap_keys;
    w_tensor *t;
    int n_t, cap_t;
    int failed;
    char fail_msg[256];
    /* while writing */
    FILE *f;                 /* fa.f, or the caller's stream */
    files_atomic fa;         /* the temporary file beside path (not used for a stream) */
    int stream;
    char *path;
    int cur;                 /* tensor being written */
    uint64_t cur_done;       /* its bytes so far */
};

static int wfail(gguf_writer *w, const char *msg, const char *key)
{
    if (!w->failed) {
        snprintf(w->fail_msg, sizeof w->fail_msg, "%s%s%s", msg, key ? ": " : "", key ? key : "");
        w->failed = 1;
    }
    return -1;
}

gguf_writer *gguf_writer_create(uint32_t alignment)
{
    if (alignment == 0) alignment = 32;
    if (alignment & (alignment - 1)) return NULL;
    gguf_writer *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->alignment = alignment;
    if (alignment != 32) gguf_w_u32(w, "general.alignment", alignment);
    return w;
}

void gguf_writer_free(gguf_writer *w)
{
    if (!w) return;
    if (w->f && !w->stream) files_atomic_abort(&w->fa);
    for (int64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    for (int i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->t);
    bw_free(&w->kv);
    free(w->path);
    free(w);
}

static void put_u32(bytes_w *b, uint32_t v) { bw_put(b, &v, 4); }
static void put_u64(bytes_w *b, uint64_t v) { bw_put(b, &v, 8); }
static void put_str(bytes_w *b, const char *s, uint64_t len)
{
    put_u64(b, len);
    bw_put(b, s, (size_t)len);
}

/* The record's key and value type; -1 for a duplicate or empty key, or when writing has begun. */
static int begin_kv(gguf_writer *w, const char *key, enum gguf_vtype t)
{
    if (w->failed) return -1;
    if (w->f || w->path) return wfail(w, "metadata added after the header was written", key);
    if (!key || !*key) return wfail(w, "empty metadata key", NULL);
    for (int64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key)) return wfail(w, "duplicate metadata key", key);
    if (w->n_kv == w->cap_keys) {
        int64_t nc = w->cap_keys ? w->cap_keys * 2 : 32;
        char **nk = realloc(w->keys, sizeof *nk * (size_t)nc);
        if (!nk) return wfail(w, "out of memory", NULL);
        w->keys = nk;
        w->cap_keys = nc;
    }
    if (!(w->keys[w->n_kv] = strdup(key))) return wfail(w, "out of memory", NULL);
    w->n_kv++;
    put_str(&w->kv, key, strlen(key));
    put_u32(&w->kv, (uint32_t)t);
    return 0;
}

static int end_kv(gguf_writer *w) { return w->kv.err ? wfail(w, "out of memory", NULL) : 0; }

static int scalar(gguf_writer *w, const char *key, enum gguf_vtype t, const void *v, size_t n)
{
    if (begin_kv(w, key, t)) return -1;
    bw_put(&w->kv, v, n);
    return end_kv(w);
}

int gguf_w_u8(gguf_writer *w, const char *key, uint8_t v) { return scalar(w, key, GGUF_VT_UINT8, &v, 1); }
int gguf_w_i8(gguf_writer *w, const char *key, int8_t v) { return scalar(w, key, GGUF_VT_INT8, &v, 1); }
int gguf_w_u16(gguf_writer *w, const char *key, uint16_t v) { return scalar(w, key, GGUF_VT_UINT16, &v, 2); }
int gguf_w_i16(gguf_writer *w, const char *key, int16_t v) { return scalar(w, key, GGUF_VT_INT16, &v, 2); }
int gguf_w_u32(gguf_writer *w, const char *key, uint32_t v) { return scalar(w, key, GGUF_VT_UINT32, &v, 4); }
int gguf_w_i32(gguf_writer *w, const char *key, int32_t v) { return scalar(w, key, GGUF_VT_INT32, &v, 4); }
int gguf_w_f32(gguf_writer *w, const char *key, float v) { return scalar(w, key, GGUF_VT_FLOAT32, &v, 4); }
int gguf_w_u64(gguf_writer *w, const char *key, uint64_t v) { return scalar(w, key, GGUF_VT_UINT64, &v, 8); }
int gguf_w_i64(gguf_writer *w, const char *key, int64_t v) { return scalar(w, key, GGUF_VT_INT64, &v, 8); }
int gguf_w_f64(gguf_writer *w, const char *key, double v) { return scalar(w, key, GGUF_VT_FLOAT64, &v, 8); }

int gguf_w_bool(gguf_writer *w, const char *key, int v)
{
    uint8_t b = v ? 1 : 0;
    return scalar(w, key, GGUF_VT_BOOL, &b, 1);
}

int gguf_w_str(gguf_writer *w, const char *key, const char *v)
{
    if (begin_kv(w, key, GGUF_VT_STRING)) return -1;
    put_str(&w->kv, v, strlen(v));
    return end_kv(w);
}

static size_t elem_size(enum gguf_vtype t)
{
    switch (t) {
    case GGUF_VT_UINT8: case GGUF_VT_INT8: case GGUF_VT_BOOL: return 1;
    case GGUF_VT_UINT16: case GGUF_VT_INT16: return 2;
    case GGUF_VT_UINT32: case GGUF_VT_INT32: case GGUF_VT_FLOAT32: return 4;
    case GGUF_VT_UINT64: case GGUF_VT_INT64: case GGUF_VT_FLOAT64: return 8;
    default: return 0;
    }
}

int gguf_w_arr(gguf_writer *w, const char *key, enum gguf_vtype elem, const void *data, uint64_t n)
{
    size_t es = elem_size(elem);
    if (!es) return wfail(w, "array of strings or arrays given as numbers", key);
    if (n > ((uint64_t)1 << 40) / es) return wfail(w, "array too large", key);
    if (begin_kv(w, key, GGUF_VT_ARRAY)) return -1;
    put_u32(&w->kv, (uint32_t)elem);
    put_u64(&w->kv, n);
    bw_put(&w->kv, data, (size_t)(n * es));
    return end_kv(w);
}

int gguf_w_arr_str(gguf_writer *w, const char *key, const char *const *v, uint64_t n)
{
    if (begin_kv(w, key, GGUF_VT_ARRAY)) return -1;
    put_u32(&w->kv, (uint32_t)GGUF_VT_STRING);
    put_u64(&w->kv, n);
    for (uint64_t i = 0; i < n; i++) put_str(&w->kv, v[i], strlen(v[i]));
    return end_kv(w);
}

int gguf_w_copy_kv(gguf_writer *w, const gguf_file *src, int64_t i)
{
    const void *raw;
    uint64_t len;
    if (gguf_kv_raw(src, i, &raw, &len)) return wfail(w, "no such metadata entry in the source file", NULL);
    gguf_str k = gguf_key_name(src, i);
    char *key = malloc(k.len + 1);
    if (!key) return wfail(w, "out of memory", NULL);
    memcpy(key, k.ptr, k.len);
    key[k.len] = 0;
    int rc = -1;
    if (strlen(key) != k.len) {
        rc = wfail(w, "a metadata key with a NUL byte", NULL);
    } else if (!begin_kv(w, key, gguf_kv_type(src, i))) {
        bw_put(&w->kv, raw, (size_t)len);
        rc = end_kv(w);
    }
    free(key);
    return rc;
}

int gguf_w_tensor(gguf_writer *w, const char *name, int n_dims, const int64_t *ne, uint32_t type)
{
    if (w->failed) return -1;
    if (w->f || w->path) return wfail(w, "tensor added after the header was written", name);
    if (!name || !*name) return wfail(w, "empty tensor name", NULL);
    if (n_dims < 1 || n_dims > 4) return wfail(w, "a tensor needs 1 to 4 dimensions", name);
    for (int i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name)) return wfail(w, "duplicate tensor name", name);
    int64_t blck, tsize;
    if (quant_block_geometry(type, &blck, &tsize)) return wfail(w, "unknown tensor type", name);
    uint64_t bytes = 1;
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] <= 0 || (d == 0 && ne[0] % blck)) return wfail(w, "bad tensor shape for its type", name);
        uint64_t units = d == 0 ? (uint64_t)(ne[0] / blck) * (uint64_t)tsize : (uint64_t)ne[d];
        if (__builtin_mul_overflow(bytes, units, &bytes)) return wfail(w, "tensor too large", name);
    }
    if (w->n_t == w->cap_t) {
        int nc = w->cap_t ? w->cap_t * 2 : 64;
        w_tensor *nt = realloc(w->t, sizeof *nt * (size_t)nc);
        if (!nt) return wfail(w, "out of memory", NULL);
        w->t = nt;
        w->cap_t = nc;
    }
    w_tensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return wfail(w, "out of memory", NULL);
    t->n_dims = n_dims;
    for (int d = 0; d < 4; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->type = type;
    t->nbytes = bytes;
    uint64_t off = 0;
    if (w->n_t > 0) {
        const w_tensor *p = &w->t[w->n_t - 1];
        off = p->offset + (p->nbytes + w->alignment - 1) / w->alignment * w->alignment;
    }
    t->offset = off;
    w->n_t++;
    return 0;
}

uint64_t gguf_w_tensor_bytes(const gguf_writer *w, int i) { return i >= 0 && i < w->n_t ? w->t[i].nbytes : 0; }

uint64_t gguf_w_data_bytes(const gguf_writer *w)
{
    uint64_t s = 0;
    for (int i = 0; i < w->n_t; i++) s += w->t[i].nbytes;
    return s;
}

static int io_fail(gguf_writer *w, const char *what, char *err, size_t errlen)
{
    snprintf(err, errlen, "%s: %s: %s", w->path, what, strerror(errno ? errno : EIO));
    return -1;
}

static int pad_to(gguf_writer *w, uint64_t n, char *err, size_t errlen)
{
    static const uint8_t zeros[64];
    while (n > 0) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        if (fwrite(zeros, 1, k, w->f) != k) return io_fail(w, "write failed", err, errlen);
        n -= k;
    }
    return 0;
}

/* The header (everything before the tensors' bytes) to w->f, and the padding after it. */
static int write_header(gguf_writer *w, char *err, size_t errlen)
{
    bytes_w h = { 0 };
    bw_put(&h, "GGUF", 4);
    put_u32(&h, 3);
    put_u64(&h, (uint64_t)w->n_t);
    put_u64(&h, (uint64_t)w->n_kv);
    bw_put(&h, w->kv.p, w->kv.n);
    for (int i = 0; i < w->n_t; i++) {
        const w_tensor *t = &w->t[i];
        put_str(&h, t->name, strlen(t->name));
        put_u32(&h, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++) put_u64(&h, (uint64_t)t->ne[d]);
        put_u32(&h, t->type);
        put_u64(&h, t->offset);
    }
    int rc = 0;
    if (h.err) {
        snprintf(err, errlen, "%s: out of memory", w->path);
        rc = -1;
    } else if (fwrite(h.p, 1, h.n, w->f) != h.n) {
        rc = io_fail(w, "write failed", err, errlen);
    } else if (w->n_t > 0) {
        rc = pad_to(w, (w->alignment - h.n % w->alignment) % w->alignment, err, errlen);
    }
    bw_free(&h);
    w->cur = 0;
    w->cur_done = 0;
    return rc;
}

static int begin_check(gguf_writer *w, const char *path, char *err, size_t errlen)
{
    if (w->failed) {
        snprintf(err, errlen, "%s: %s", path, w->fail_msg);
        return -1;
    }
    if (w->f || w->path) {
        snprintf(err, errlen, "%s: the header was already written", path);
        return -1;
    }
    if (!(w->path = strdup(path))) {
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    return 0;
}

int gguf_w_begin(gguf_writer *w, const char *path, int overwrite, char *err, size_t errlen)
{
    if (begin_check(w, path, err, errlen)) return -1;
    /* a fresh file of our own beside the destination (files_atomic: O_EXCL, so never what is
     * already there, a link included); only a regular file or a link is ever replaced */
    int rc = overwrite ? files_atomic_open(&w->fa, path, err, errlen) : files_atomic_open_new(&w->fa, path, err, errlen);
    if (rc) return rc;
    w->f = w->fa.f;
    setvbuf(w->f, NULL, _IOFBF, (size_t)1 << 20);
    if ((rc = write_header(w, err, errlen)) != 0) {
        files_atomic_abort(&w->fa);
        w->f = NULL;
    }
    return rc;
}

int gguf_w_begin_stream(gguf_writer *w, FILE *f, const char *name, char *err, size_t errlen)
{
    if (begin_check(w, name, err, errlen)) return -1;
    w->f = f;
    w->stream = 1;
    int rc = write_header(w, err, errlen);
    if (rc) w->f = NULL;
    return rc;
}

int gguf_w_data(gguf_writer *w, const void *bytes, size_t n, char *err, size_t errlen)
{
    if (!w->f) {
        snprintf(err, errlen, "tensor data given before the header");
        return -1;
    }
    const uint8_t *p = bytes;
    while (n > 0) {
        if (w->cur >= w->n_t) {
            snprintf(err, errlen, "%s: more tensor data than the tensors hold", w->path);
            return -1;
        }
        w_tensor *t = &w->t[w->cur];
        uint64_t room = t->nbytes - w->cur_done;
        size_t k = n < room ? n : (size_t)room;
        if (fwrite(p, 1, k, w->f) != k) return io_fail(w, "write failed", err, errlen);
        p += k;
        n -= k;
        w->cur_done += k;
        if (w->cur_done == t->nbytes) {
            /* the next tensor starts at the alignment (the last one is padded too, as the
             * reference writer does) */
            if (pad_to(w, (w->alignment - t->nbytes % w->alignment) % w->alignment, err, errlen)) return -1;
            w->cur++;
            w->cur_done = 0;
        }
    }
    return 0;
}

int gguf_w_finish(gguf_writer *w, char *err, size_t errlen)
{
    if (!w->f) {
        snprintf(err, errlen, "nothing to finish: the header was not written");
        return -1;
    }
    int rc = 0;
    if (w->cur < w->n_t) {
        snprintf(err, errlen, "%s: tensor %s has %llu of its %llu bytes", w->path, w->t[w->cur].name,
                 (unsigned long long)w->cur_done, (unsigned long long)w->t[w->cur].nbytes);
        rc = -1;
    }
    FILE *f = w->f;
    w->f = NULL;
    if (w->stream) {   /* the caller's: flushed, not closed */
        if (rc == 0 && (fflush(f) != 0 || ferror(f))) rc = io_fail(w, "write failed", err, errlen);
        return rc;
    }
    if (rc) {
        files_atomic_abort(&w->fa);
        return rc;
    }
    return files_atomic_commit(&w->fa, err, errlen);
}
