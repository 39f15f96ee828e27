/* gguf.c - GGUF reader (see gguf.h).
 *
 * Parsing is a single forward pass over the mapped bytes through a bounds-checked cursor; every count
 * is compared with the bytes that remain before anything is allocated for it, so a corrupt or hostile
 * file costs at most its own size in memory and ends in a one-line error. */
#include "engine/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/quant.h"
#include "common/files.h"

typedef struct gguf_kv {
    gguf_str key;
    enum gguf_vtype type;
    const uint8_t *val;        /* scalar value, or first array element */
    enum gguf_vtype elem;      /* arrays */
    uint64_t n;                /* arrays: element count */
    gguf_str *strs;            /* arrays of strings: index */
    const uint8_t *raw;        /* the value as stored (for arrays: from the element type on) */
    uint64_t raw_len;
} gguf_kv;

struct gguf_file {
    const uint8_t *base;
    uint64_t size;
    int mapped;
    uint32_t version;
    uint32_t alignment;
    int64_t n_kv;
    gguf_kv *kv;
    int64_t n_tensors;
    gguf_tensor *tensors;
    int64_t *thash;            /* open-addressing table of tensor indices, -1 = empty */
    uint64_t thash_cap;
    uint64_t data_offset;
};

typedef struct cursor {
    const uint8_t *p;
    uint64_t pos, size;
    const char *label;
    char *err;
    size_t errlen;
} cursor;

static int cfail(cursor *c, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* Names quoted from the file may hold control bytes: keep the message one printable line. */
    for (char *q = msg; *q; q++)
        if ((unsigned char)*q < 0x20 || *q == 0x7f) *q = '?';
    snprintf(c->err, c->errlen, "%s: %s", c->label, msg);
    return -1;
}

static uint64_t remain(const cursor *c) { return c->size - c->pos; }

static int take(cursor *c, uint64_t n, const uint8_t **out, const char *what)
{
    if (n > remain(c))
        return cfail(c, "truncated: %s at byte %llu needs %llu bytes, file has %llu", what,
                     (unsigned long long)c->pos, (unsigned long long)n, (unsigned long long)c->size);
    *out = c->p + c->pos;
    c->pos += n;
    return 0;
}

static int rd_u32(cursor *c, uint32_t *v, const char *what)
{
    const uint8_t *b = NULL;
    if (take(c, 4, &b, what)) return -1;
    memcpy(v, b, 4);
    return 0;
}

static int rd_u64(cursor *c, uint64_t *v, const char *what)
{
    const uint8_t *b = NULL;
    if (take(c, 8, &b, what)) return -1;
    memcpy(v, b, 8);
    return 0;
}

static int rd_str(cursor *c, gguf_str *s, const char *what)
{
    uint64_t len;
    if (rd_u64(c, &len, what)) return -1;
    if (len > remain(c))
        return cfail(c, "truncated or corrupt: %s at byte %llu claims %llu bytes, only %llu remain", what,
                     (unsigned long long)(c->pos - 8), (unsigned long long)len, (unsigned long long)remain(c));
    const uint8_t *b = NULL;
    take(c, len, &b, what);
    s->ptr = (const char *)b;
    s->len = len;
    return 0;
}

static const uint8_t vt_size[GGUF_VT_COUNT] = {
    [GGUF_VT_UINT8] = 1, [GGUF_VT_INT8] = 1, [GGUF_VT_UINT16] = 2, [GGUF_VT_INT16] = 2,
    [GGUF_VT_UINT32] = 4, [GGUF_VT_INT32] = 4, [GGUF_VT_FLOAT32] = 4, [GGUF_VT_BOOL] = 1,
    [GGUF_VT_UINT64] = 8, [GGUF_VT_INT64] = 8, [GGUF_VT_FLOAT64] = 8,
};

const char *gguf_vtype_name(enum gguf_vtype t)
{
    static const char *names[GGUF_VT_COUNT] = { "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
                                                "bool", "string", "array", "uint64", "int64", "float64" };
    return (unsigned)t < GGUF_VT_COUNT ? names[t] : "unknown";
}

int gguf_str_eq(gguf_str s, const char *cstr)
{
    size_t n = strlen(cstr);
    return s.len == n && memcmp(s.ptr, cstr, n) == 0;
}

static uint64_t hash_bytes(const char *p, uint64_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 1099511628211ull;
    return h;
}

/* Skip (validate) one value of type t; nested arrays are accepted and skipped. */
static int skip_value(cursor *c, enum gguf_vtype t, int depth, const char *key)
{
    if ((unsigned)t >= GGUF_VT_COUNT) return cfail(c, "key '%s' has unknown value type %u", key, (unsigned)t);
    if (t == GGUF_VT_STRING) {
        gguf_str s;
        return rd_str(c, &s, "string value");
    }
    if (t == GGUF_VT_ARRAY) {
        if (depth > 4) return cfail(c, "key '%s': arrays nested too deeply", key);
        uint32_t et;
        uint64_t n;
        if (rd_u32(c, &et, "array type") || rd_u64(c, &n, "array count")) return -1;
        if (et >= GGUF_VT_COUNT) return cfail(c, "key '%s': unknown array element type %u", key, et);
        if (et == GGUF_VT_STRING || et == GGUF_VT_ARRAY) {
            /* each element needs at least 8 bytes (its length or header) */
            if (n > remain(c) / 8)
                return cfail(c, "truncated or corrupt: key '%s' array of %llu elements exceeds the file", key, (unsigned long long)n);
            for (uint64_t i = 0; i < n; i++)
                if (skip_value(c, (enum gguf_vtype)et, depth + 1, key)) return -1;
            return 0;
        }
        if (n > remain(c) / vt_size[et])
            return cfail(c, "truncated or corrupt: key '%s' array of %llu elements exceeds the file", key, (unsigned long long)n);
        const uint8_t *b = NULL;
        take(c, n * vt_size[et], &b, "array");
        if (et == GGUF_VT_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (b[i] > 1) return cfail(c, "corrupt: key '%s' has bool value %u", key, b[i]);
        return 0;
    }
    const uint8_t *b = NULL;
    if (take(c, vt_size[t], &b, "value")) return -1;
    if (t == GGUF_VT_BOOL && *b > 1) return cfail(c, "corrupt: key '%s' has bool value %u", key, *b);
    return 0;
}

static int parse(gguf_file *f, cursor *c)
{
    const uint8_t *b = NULL;
    if (c->size < 4 || memcmp(c->p, "GGUF", 4) != 0) return cfail(c, "not a GGUF file (bad magic)");
    take(c, 4, &b, "magic");
    if (rd_u32(c, &f->version, "version")) return -1;
    if ((f->version & 0xFFFF) == 0 && f->version != 0)
        return cfail(c, "GGUF version field %#x looks big-endian; only little-endian files are supported", f->version);
    if (f->version == 1) return cfail(c, "GGUF version 1 is no longer supported");
    if (f->version < 2 || f->version > 3) return cfail(c, "unsupported GGUF version %u", f->version);
    uint64_t nt, nkv;
    if (rd_u64(c, &nt, "tensor count") || rd_u64(c, &nkv, "metadata count")) return -1;
    /* A key/value record takes at least 8+4+1 bytes; a tensor record at least 8+4+8+4+8. */
    if (nkv > remain(c) / 13) return cfail(c, "truncated or corrupt: %llu metadata entries cannot fit in the file", (unsigned long long)nkv);
    if (nt > remain(c) / 32) return cfail(c, "truncated or corrupt: %llu tensors cannot fit in the file", (unsigned long long)nt);
    f->n_kv = (int64_t)nkv;
    f->n_tensors = (int64_t)nt;
    f->kv = calloc(nkv ? nkv : 1, sizeof *f->kv);
    f->tensors = calloc(nt ? nt : 1, sizeof *f->tensors);
    if (!f->kv || !f->tensors) return cfail(c, "out of memory");
    f->alignment = 32;
    for (uint64_t i = 0; i < nkv; i++) {
        gguf_kv *kv = &f->kv[i];
        uint32_t t;
        if (rd_str(c, &kv->key, "metadata key")) return -1;
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)(kv->key.len > 100 ? 100 : kv->key.len), kv->key.ptr);
        for (uint64_t j = 0; j < i; j++)
            if (f->kv[j].key.len == kv->key.len && !memcmp(f->kv[j].key.ptr, kv->key.ptr, kv->key.len))
                return cfail(c, "corrupt: duplicate metadata key '%s'", key);
        if (rd_u32(c, &t, "value type")) return -1;
        if (t >= GGUF_VT_COUNT) return cfail(c, "key '%s' has unknown value type %u", key, t);
        kv->type = (enum gguf_vtype)t;
        kv->val = c->p + c->pos;
        kv->raw = kv->val;
        if (t == GGUF_VT_ARRAY) {
            uint64_t save = c->pos;
            uint32_t et;
            uint64_t n;
            if (rd_u32(c, &et, "array type") || rd_u64(c, &n, "array count")) return -1;
            kv->elem = (enum gguf_vtype)et;
            kv->n = n;
            kv->val = c->p + c->pos;
            c->pos = save;
            if (skip_value(c, GGUF_VT_ARRAY, 0, key)) return -1;
            if (et == GGUF_VT_STRING) {
                kv->strs = malloc(sizeof *kv->strs * (n ? n : 1));
                if (!kv->strs) return cfail(c, "out of memory");
                cursor sc = *c;
                sc.pos = (uint64_t)(kv->val - c->p);
                for (uint64_t k = 0; k < n; k++) rd_str(&sc, &kv->strs[k], "string");
            }
        } else if (skip_value(c, kv->type, 0, key)) {
            return -1;
        }
        kv->raw_len = (uint64_t)(c->p + c->pos - kv->raw);
        if (gguf_str_eq(kv->key, "general.alignment")) {
            if (kv->type != GGUF_VT_UINT32) return cfail(c, "general.alignment must be uint32");
            uint32_t a;
            memcpy(&a, kv->val, 4);
            if (a == 0 || (a & (a - 1)) != 0) return cfail(c, "corrupt: general.alignment %u is not a power of two", a);
            f->alignment = a;
        }
    }
    for (uint64_t i = 0; i < nt; i++) {
        gguf_tensor *t = &f->tensors[i];
        if (rd_str(c, &t->name, "tensor name")) return -1;
        char nm[96];
        snprintf(nm, sizeof nm, "%.*s", (int)(t->name.len > 80 ? 80 : t->name.len), t->name.ptr);
        if (rd_u32(c, &t->n_dims, "tensor dims")) return -1;
        if (t->n_dims == 0 || t->n_dims > 4) return cfail(c, "tensor '%s' has %u dimensions (1 to 4 allowed)", nm, t->n_dims);
        for (int d = 0; d < 4; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            uint64_t v;
            if (rd_u64(c, &v, "tensor shape")) return -1;
            if (v > (uint64_t)INT64_MAX / 2) return cfail(c, "tensor '%s' has a negative or huge dimension", nm);
            t->ne[d] = (int64_t)v;
        }
        if (rd_u32(c, &t->type, "tensor type") || rd_u64(c, &t->offset, "tensor offset")) return -1;
        int64_t blck, tsize;
        if (t->type >= GGML_TYPE_MAX_ID || quant_block_geometry(t->type, &blck, &tsize) != 0)
            return cfail(c, "tensor '%s' has unknown type id %u", nm, t->type);
        if (t->ne[0] % blck != 0)
            return cfail(c, "tensor '%s': row length %lld is not a multiple of the %s block size %lld", nm,
                         (long long)t->ne[0], quant_type_name(t->type), (long long)blck);
        uint64_t nb = (uint64_t)(t->ne[0] / blck), tmp;
        if (__builtin_mul_overflow(nb, (uint64_t)tsize, &tmp) || __builtin_mul_overflow(tmp, (uint64_t)t->ne[1], &tmp) ||
            __builtin_mul_overflow(tmp, (uint64_t)t->ne[2], &tmp) || __builtin_mul_overflow(tmp, (uint64_t)t->ne[3], &tmp))
            return cfail(c, "tensor '%s': size overflows", nm);
        t->nbytes = tmp;
        if (t->offset % f->alignment != 0)
            return cfail(c, "corrupt: tensor '%s' offset %llu is not aligned to %u", nm, (unsigned long long)t->offset,
                         f->alignment);
    }
    uint64_t data = c->pos;
    if (nt > 0) data = (c->pos + f->alignment - 1) / f->alignment * f->alignment;
    f->data_offset = data;
    for (uint64_t i = 0; i < nt; i++) {
        gguf_tensor *t = &f->tensors[i];
        uint64_t end;
        if (data > c->size || t->offset > c->size - data || __builtin_add_overflow(data + t->offset, t->nbytes, &end) ||
            end > c->size)
            return cfail(c, "truncated: tensor '%.*s' (%llu bytes at offset %llu) extends past the end of the file (%llu bytes)",
                         (int)(t->name.len > 80 ? 80 : t->name.len), t->name.ptr, (unsigned long long)t->nbytes,
                         (unsigned long long)(data + t->offset), (unsigned long long)c->size);
        t->data = c->p + data + t->offset;
    }
    /* Name index; duplicates are corrupt files. */
    f->thash_cap = 16;
    while (f->thash_cap < nt * 2) f->thash_cap *= 2;
    f->thash = malloc(sizeof *f->thash * f->thash_cap);
    if (!f->thash) return cfail(c, "out of memory");
    for (uint64_t i = 0; i < f->thash_cap; i++) f->thash[i] = -1;
    for (uint64_t i = 0; i < nt; i++) {
        const gguf_tensor *t = &f->tensors[i];
        uint64_t h = hash_bytes(t->name.ptr, t->name.len) & (f->thash_cap - 1);
        while (f->thash[h] >= 0) {
            const gguf_tensor *o = &f->tensors[f->thash[h]];
            if (o->name.len == t->name.len && !memcmp(o->name.ptr, t->name.ptr, t->name.len))
                return cfail(c, "corrupt: duplicate tensor name '%.*s'", (int)(t->name.len > 80 ? 80 : t->name.len),
                             t->name.ptr);
            h = (h + 1) & (f->thash_cap - 1);
        }
        f->thash[h] = (int64_t)i;
    }
    return 0;
}

int gguf_open_memory(gguf_file **out, const void *buf, size_t size, const char *label, char *err, size_t errlen)
{
    *out = NULL;
    gguf_file *f = calloc(1, sizeof *f);
    if (!f) {
        snprintf(err, errlen, "%s: out of memory", label);
        return -1;
    }
    f->base = buf;
    f->size = size;
    cursor c = { buf, 0, size, label, err, errlen };
    if (parse(f, &c) != 0) {
        gguf_free(f);
        return -1;
    }
    *out = f;
    return 0;
}

int gguf_open(gguf_file **out, const char *path, char *err, size_t errlen)
{
    *out = NULL;
    uint64_t size;
    int fd = files_open_read_fd(path, UINT64_MAX, "a model file", &size, err, errlen);
    if (fd < 0) return -1;
    if (size < 4) {
        snprintf(err, errlen, "%s: not a GGUF file (%lld bytes)", path, (long long)size);
        close(fd);
        return -1;
    }
    void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    int merr = errno;
    close(fd);
    if (p == MAP_FAILED) {
        snprintf(err, errlen, "%s: cannot map the file: %s", path, strerror(merr));
        return -1;
    }
    if (gguf_open_memory(out, p, (size_t)size, path, err, errlen) != 0) {
        munmap(p, (size_t)size);
        return -1;
    }
    (*out)->mapped = 1;
    return 0;
}

void gguf_free(gguf_file *f)
{
    if (!f) return;
    if (f->kv)
        for (int64_t i = 0; i < f->n_kv; i++) free(f->kv[i].strs);
    free(f->kv);
    free(f->tensors);
    free(f->thash);
    if (f->mapped) munmap((void *)f->base, f->size);
    free(f);
}

uint32_t gguf_version(const gguf_file *f) { return f->version; }
uint64_t gguf_file_size(const gguf_file *f) { return f->size; }
uint32_t gguf_alignment(const gguf_file *f) { return f->alignment; }
int64_t gguf_n_kv(const gguf_file *f) { return f->n_kv; }
int64_t gguf_n_tensors(const gguf_file *f) { return f->n_tensors; }

int64_t gguf_find_key(const gguf_file *f, const char *key)
{
    for (int64_t i = 0; i < f->n_kv; i++)
        if (gguf_str_eq(f->kv[i].key, key)) return i;
    return -1;
}

gguf_str gguf_key_name(const gguf_file *f, int64_t i) { return f->kv[i].key; }
enum gguf_vtype gguf_kv_type(const gguf_file *f, int64_t i) { return f->kv[i].type; }

/* Integer value of element p of type t; 0 and *ok = 0 for non-integers. */
static int read_int(enum gguf_vtype t, const uint8_t *p, int64_t *v, uint64_t *uv, int *is_unsigned)
{
    *is_unsigned = 0;
    switch (t) {
    case GGUF_VT_UINT8: *v = *p; break;
    case GGUF_VT_INT8: *v = (int8_t)*p; break;
    case GGUF_VT_BOOL: *v = *p; break;
    case GGUF_VT_UINT16: { uint16_t x; memcpy(&x, p, 2); *v = x; break; }
    case GGUF_VT_INT16: { int16_t x; memcpy(&x, p, 2); *v = x; break; }
    case GGUF_VT_UINT32: { uint32_t x; memcpy(&x, p, 4); *v = x; break; }
    case GGUF_VT_INT32: { int32_t x; memcpy(&x, p, 4); *v = x; break; }
    case GGUF_VT_INT64: { memcpy(v, p, 8); break; }
    case GGUF_VT_UINT64: { memcpy(uv, p, 8); *is_unsigned = 1; *v = (int64_t)*uv; break; }
    default: return -2;
    }
    if (!*is_unsigned) *uv = (uint64_t)*v;
    return 0;
}

static const gguf_kv *kv_of(const gguf_file *f, const char *key)
{
    int64_t i = gguf_find_key(f, key);
    return i < 0 ? NULL : &f->kv[i];
}

int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out)
{
    const gguf_kv *kv = kv_of(f, key);
    if (!kv) return -1;
    if (kv->type == GGUF_VT_BOOL) return -2;
    int64_t v;
    uint64_t uv;
    int u;
    if (read_int(kv->type, kv->val, &v, &uv, &u)) return -2;
    if (u && uv > (uint64_t)INT64_MAX) return -2;
    *out = v;
    return 0;
}

int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out)
{
    int64_t v;
    int rc = gguf_get_i64(f, key, &v);
    if (rc) return rc;
    if (v < 0 || v > (int64_t)UINT32_MAX) return -2;
    *out = (uint32_t)v;
    return 0;
}

int gguf_get_f32(const gguf_file *f, const char *key, float *out)
{
    const gguf_kv *kv = kv_of(f, key);
    if (!kv) return -1;
    if (kv->type == GGUF_VT_FLOAT32) {
        memcpy(out, kv->val, 4);
        return 0;
    }
    if (kv->type == GGUF_VT_FLOAT64) {
        double d;
        memcpy(&d, kv->val, 8);
        *out = (float)d;
        return 0;
    }
    return -2;
}

int gguf_get_bool(const gguf_file *f, const char *key, int *out)
{
    const gguf_kv *kv = kv_of(f, key);
    if (!kv) return -1;
    if (kv->type != GGUF_VT_BOOL) return -2;
    *out = kv->val[0] != 0;
    return 0;
}

int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out)
{
    const gguf_kv *kv = kv_of(f, key);
    if (!kv) return -1;
    if (kv->type != GGUF_VT_STRING) return -2;
    uint64_t len;
    memcpy(&len, kv->val, 8);
    out->ptr = (const char *)kv->val + 8;
    out->len = len;
    return 0;
}

int gguf_get_arr(const gguf_file *f, const char *key, enum gguf_vtype *elem_type, uint64_t *n, const void **data)
{
    const gguf_kv *kv = kv_of(f, key);
    if (!kv) return -1;
    if (kv->type != GGUF_VT_ARRAY) return -2;
    *elem_type = kv->elem;
    *n = kv->n;
    *data = kv->val;
    return 0;
}

int gguf_arr_str(const gguf_file *f, const char *key, uint64_t i, gguf_str *out)
{
    const gguf_kv *kv = kv_of(f, key);
    if (!kv) return -1;
    if (kv->type != GGUF_VT_ARRAY || kv->elem != GGUF_VT_STRING || i >= kv->n) return -2;
    *out = kv->strs[i];
    return 0;
}

int gguf_arr_i64(const gguf_file *f, const char *key, uint64_t i, int64_t *out)
{
    const gguf_kv *kv = kv_of(f, key);
    if (!kv) return -1;
    if (kv->type != GGUF_VT_ARRAY || i >= kv->n || kv->elem >= GGUF_VT_COUNT || kv->elem == GGUF_VT_STRING ||
        kv->elem == GGUF_VT_ARRAY)
        return -2;
    uint64_t uv;
    int u;
    if (read_int(kv->elem, kv->val + i * vt_size[kv->elem], out, &uv, &u)) return -2;
    if (u && uv > (uint64_t)INT64_MAX) return -2;
    return 0;
}

int gguf_arr_f64(const gguf_file *f, const char *key, uint64_t i, double *out)
{
    const gguf_kv *kv = kv_of(f, key);
    if (!kv) return -1;
    if (kv->type != GGUF_VT_ARRAY || i >= kv->n) return -2;
    if (kv->elem == GGUF_VT_FLOAT32) {
        float x;
        memcpy(&x, kv->val + i * 4, 4);
        *out = x;
        return 0;
    }
    if (kv->elem == GGUF_VT_FLOAT64) {
        memcpy(out, kv->val + i * 8, 8);
        return 0;
    }
    return -2;
}

int gguf_kv_raw(const gguf_file *f, int64_t i, const void **bytes, uint64_t *len)
{
    if (i < 0 || i >= f->n_kv) return -1;
    *bytes = f->kv[i].raw;
    *len = f->kv[i].raw_len;
    return 0;
}

const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i)
{
    return i >= 0 && i < f->n_tensors ? &f->tensors[i] : NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name)
{
    if (!f->thash) return NULL;
    uint64_t n = strlen(name);
    uint64_t h = hash_bytes(name, n) & (f->thash_cap - 1);
    while (f->thash[h] >= 0) {
        const gguf_tensor *t = &f->tensors[f->thash[h]];
        if (t->name.len == n && !memcmp(t->name.ptr, name, n)) return t;
        h = (h + 1) & (f->thash_cap - 1);
    }
    return NULL;
}
