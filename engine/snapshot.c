/* snapshot.c - serialize and restore a sequence (see snapshot.h). */
#include "engine/snapshot.h"

#include <errno.h>
#include <nettle/sha2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/files.h"
#include "engine/bytes.h"
#include "engine/policy/policy.h"

static const char MAGIC[8] = { 'K', 'V', 'C', 'H', 'A', 'T', 'S', 'N' };
#define BOM 0x01020304u
#define HEADER_BYTES (8 + 4 + 4 + 8)

static void hex(const uint8_t *d, size_t n, char *out)
{
    static const char h[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = h[d[i] >> 4];
        out[2 * i + 1] = h[d[i] & 15];
    }
    out[2 * n] = 0;
}

void snap_sha256_bytes(const void *p, size_t n, char out[65])
{
    struct sha256_ctx c;
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_init(&c);
    sha256_update(&c, n, p);
    sha256_digest(&c, sizeof d, d);
    hex(d, sizeof d, out);
}

int snap_sha256_file(const char *path, char out[65], char *err, size_t errlen)
{
    FILE *f = files_open_read(path, UINT64_MAX, "a regular file", err, errlen);
    if (!f) return -1;
    enum { BUF = 1 << 20 };
    uint8_t *buf = malloc(BUF);
    if (!buf) {
        fclose(f);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    struct sha256_ctx c;
    sha256_init(&c);
    size_t n;
    while ((n = fread(buf, 1, BUF, f)) > 0) sha256_update(&c, n, buf);
    int bad = ferror(f);
    fclose(f);
    free(buf);
    if (bad) {
        snprintf(err, errlen, "cannot read %s", path);
        return -1;
    }
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_digest(&c, sizeof d, d);
    hex(d, sizeof d, out);
    return 0;
}

int snap_identity_of(const fwd_ctx *f, const char *model_sha256, snap_identity *id)
{
    const model *m = fwd_model(f);
    const kv_cache *kv = fwd_kv(f);
    memset(id, 0, sizeof *id);
    snprintf(id->model_sha256, sizeof id->model_sha256, "%s", model_sha256);
    id->n_layer = m->hp.n_layer;
    id->n_head_kv = m->hp.n_head_kv;
    id->head_dim = m->hp.head_dim;
    id->n_vocab = m->hp.n_vocab;
    id->page_size = kv_page_size(kv);
    return 0;
}

static void put_identity(bytes_w *w, const snap_identity *id)
{
    bw_put(w, id->model_sha256, 64);
    bw_u32(w, (uint32_t)id->n_layer);
    bw_u32(w, (uint32_t)id->n_head_kv);
    bw_u32(w, (uint32_t)id->head_dim);
    bw_u32(w, (uint32_t)id->n_vocab);
    bw_u32(w, (uint32_t)id->page_size);
}

static void get_identity(bytes_r *r, snap_identity *id)
{
    memset(id, 0, sizeof *id);
    br_get(r, id->model_sha256, 64);
    id->model_sha256[64] = 0;
    id->n_layer = (int32_t)br_u32(r);
    id->n_head_kv = (int32_t)br_u32(r);
    id->head_dim = (int32_t)br_u32(r);
    id->n_vocab = (int32_t)br_u32(r);
    id->page_size = (int32_t)br_u32(r);
}

int snap_page_size(const void *data, size_t len)
{
    size_t off = HEADER_BYTES + 64 + 4 * 4;   /* header, model sha256, layers, KV heads, head size, vocabulary */
    if (len < off + 4 || memcmp(data, MAGIC, sizeof MAGIC) != 0) return -1;
    uint32_t v;
    memcpy(&v, (const uint8_t *)data + off, 4);
    return v >= 1 && v <= 4096 ? (int)v : -1;
}

int snap_save(const fwd_ctx *f, const samp *s, const snap_identity *id, const int32_t *tokens, int64_t n_tokens,
              void **out, size_t *len, char *err, size_t errlen)
{
    const kv_cache *kv = fwd_kv(f);
    if (n_tokens < kv_len(kv)) {
        snprintf(err, errlen, "snapshot: %lld token ids for a cache of %lld positions", (long long)n_tokens,
                 (long long)kv_len(kv));
        return -1;
    }
    bytes_w w = { 0 };
    bw_put(&w, MAGIC, sizeof MAGIC);
    bw_u32(&w, SNAP_VERSION);
    bw_u32(&w, BOM);
    bw_i64(&w, 0);   /* payload length, patched below */
    size_t p0 = w.n;
    put_identity(&w, id);
    bw_i64(&w, n_tokens);
    bw_put(&w, tokens, sizeof(int32_t) * (size_t)n_tokens);
    kv_save(kv, &w);
    pol_set_save(fwd_policy(f), &w);
    size_t ss = samp_state_size();
    uint8_t *st = malloc(ss);
    if (!st) w.err = 1;
    if (st) {
        samp_save_state(s, st);
        bw_u32(&w, (uint32_t)ss);
        bw_put(&w, st, ss);
        free(st);
    }
    if (w.err) {
        bw_free(&w);
        snprintf(err, errlen, "snapshot: out of memory");
        return -1;
    }
    int64_t plen = (int64_t)(w.n - p0);
    memcpy(w.p + 16, &plen, sizeof plen);
    struct sha256_ctx c;
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_init(&c);
    sha256_update(&c, w.n, w.p);
    sha256_digest(&c, sizeof d, d);
    bw_put(&w, d, sizeof d);
    if (w.err) {
        bw_free(&w);
        snprintf(err, errlen, "snapshot: out of memory");
        return -1;
    }
    *out = w.p;
    *len = w.n;
    return 0;
}

int snap_page_ranges(const void *data, size_t len, snap_range **out, int64_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    if (len < HEADER_BYTES + SHA256_DIGEST_SIZE) return -1;
    bytes_r r = { (const uint8_t *)data, len - SHA256_DIGEST_SIZE, HEADER_BYTES + 64 + 5 * 4, 0 };
    int64_t n_tokens = br_i64(&r);
    if (r.err || n_tokens < 0 || (uint64_t)n_tokens > len / 4 || !br_view(&r, 4 * (size_t)n_tokens)) return -1;
    uint32_t nl = br_u32(&r), nh = br_u32(&r);
    int64_t rd = br_i64(&r);
    br_u32(&r);
    br_i64(&r);
    br_i64(&r);
    if (r.err || rd <= 0 || rd > (1 << 20) || nl > 4096 || nh > 4096) return -1;
    size_t cap = 256, n = 0;
    snap_range *v = malloc(sizeof *v * cap);
    if (!v) return -1;
    for (uint32_t il = 0; il < nl && !r.err; il++) {
        br_u32(&r);
        br_i64(&r);
        for (uint32_t h = 0; h < nh && !r.err; h++) {
            uint32_t np = br_u32(&r);
            for (uint32_t i = 0; i < np && !r.err; i++) {
                size_t off = r.off;
                uint32_t cnt = br_u32(&r);
                if (r.err || cnt > (1u << 20) || !br_view(&r, (size_t)cnt * (8 + 4 * (size_t)rd))) break;
                if (n == cap) {
                    snap_range *nv = realloc(v, sizeof *nv * (cap *= 2));
                    if (!nv) {
                        free(v);
                        return -1;
                    }
                    v = nv;
                }
                v[n++] = (snap_range){ off, r.off - off };
            }
        }
    }
    if (r.err) {
        free(v);
        return -1;
    }
    *out = v;
    *n_out = (int64_t)n;
    return 0;
}

/* Parse everything; with apply also restore into f and s. */
static int parse(fwd_ctx *f, samp *s, const void *data, size_t len, const snap_identity *want, snap_info *info,
                 int apply, int32_t **tokens, char *err, size_t errlen)
{
    const uint8_t *p = data;
    if (len < HEADER_BYTES + SHA256_DIGEST_SIZE || memcmp(p, MAGIC, sizeof MAGIC) != 0) {
        snprintf(err, errlen, "not a kvchat snapshot (bad magic or shorter than a header)");
        return -1;
    }
    uint32_t version, bom;
    int64_t plen;
    memcpy(&version, p + 8, 4);
    memcpy(&bom, p + 12, 4);
    memcpy(&plen, p + 16, 8);
    if (bom != BOM) {
        snprintf(err, errlen, "the snapshot was written on a machine of the other byte order");
        return -1;
    }
    if (version != SNAP_VERSION) {
        snprintf(err, errlen, "the snapshot has format version %u, this kvchat reads version %d", version, SNAP_VERSION);
        return -1;
    }
    if (plen < 0 || (uint64_t)plen != len - HEADER_BYTES - SHA256_DIGEST_SIZE) {
        snprintf(err, errlen, "the snapshot is truncated or has trailing bytes (%zu bytes, header says %lld + %d)", len,
                 (long long)plen, HEADER_BYTES + SHA256_DIGEST_SIZE);
        return -1;
    }
    struct sha256_ctx c;
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_init(&c);
    sha256_update(&c, len - SHA256_DIGEST_SIZE, p);
    sha256_digest(&c, sizeof d, d);
    if (memcmp(d, p + len - SHA256_DIGEST_SIZE, sizeof d) != 0) {
        snprintf(err, errlen, "the snapshot is corrupt (checksum mismatch)");
        return -1;
    }
    bytes_r r = { p + HEADER_BYTES, (size_t)plen, 0, 0 };
    snap_info in;
    memset(&in, 0, sizeof in);
    in.version = version;
    get_identity(&r, &in.id);
    if (r.err) goto malformed;
    snap_identity mine;
    snap_identity_of(f, want ? want->model_sha256 : in.id.model_sha256, &mine);
    if (want && strcmp(in.id.model_sha256, want->model_sha256) != 0) {
        snprintf(err, errlen, "the snapshot belongs to another model (sha256 %.12s..., this one %.12s...)",
                 in.id.model_sha256, want->model_sha256);
        return -1;
    }
    if (in.id.n_layer != mine.n_layer || in.id.n_head_kv != mine.n_head_kv || in.id.head_dim != mine.head_dim ||
        in.id.n_vocab != mine.n_vocab || in.id.page_size != mine.page_size) {
        snprintf(err, errlen, "the snapshot was taken with another cache shape (page size %d, this session %d)",
                 in.id.page_size, mine.page_size);
        return -1;
    }
    in.n_tokens = br_i64(&r);
    if (r.err || in.n_tokens < 0 || in.n_tokens > kv_n_ctx(fwd_kv(f)) + 1) goto malformed;
    const int32_t *tok = br_view(&r, sizeof(int32_t) * (size_t)in.n_tokens);
    if (!tok) goto malformed;
    for (int64_t i = 0; i < in.n_tokens; i++) {
        int32_t t;
        memcpy(&t, tok + i, sizeof t);
        if (t < 0 || t >= mine.n_vocab) {
            snprintf(err, errlen, "the snapshot has a token id %d outside the vocabulary", t);
            return -1;
        }
    }
    /* the cache: checked in full first, replaced only once everything else has been checked too */
    size_t kv_off = r.off;
    if (kv_load(fwd_cache(f), &r, 0, err, errlen)) return -1;
    in.kv_len = 0;
    memcpy(&in.kv_len, p + HEADER_BYTES + kv_off + 4 + 4 + 8 + 4, sizeof in.kv_len);
    if (in.kv_len > in.n_tokens) {
        snprintf(err, errlen, "the snapshot's cache holds %lld positions but only %lld token ids", (long long)in.kv_len,
                 (long long)in.n_tokens);
        return -1;
    }
    size_t pol_off = r.off;
    char ptext[256];
    br_str(&r, ptext, sizeof ptext);
    r.off = pol_off;
    r.err = 0;
    snprintf(in.policy, sizeof in.policy, "%s", ptext);
    if (pol_set_load(fwd_policy(f), &r, 0, err, errlen)) return -1;
    uint32_t ss = br_u32(&r);
    const void *sst = br_view(&r, ss);
    if (r.err || ss != samp_state_size()) goto malformed;
    if (r.off != r.n) goto malformed;
    if (samp_check_state(sst, mine.n_vocab, err, errlen)) return -1;
    if (info) *info = in;
    if (!apply) return 0;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(in.n_tokens > 0 ? in.n_tokens : 1));
    if (!ids) {
        snprintf(err, errlen, "out of memory restoring the snapshot");
        return -1;
    }
    memcpy(ids, tok, sizeof(int32_t) * (size_t)in.n_tokens);
    bytes_r kr = { p + HEADER_BYTES, (size_t)plen, kv_off, 0 };
    if (kv_load(fwd_cache(f), &kr, 1, err, errlen)) {
        free(ids);
        return -1;
    }
    bytes_r pr = { p + HEADER_BYTES, (size_t)plen, pol_off, 0 };
    if (pol_set_load(fwd_policy(f), &pr, 1, err, errlen)) {
        free(ids);
        return -1;
    }
    samp_load_state(s, sst);
    *tokens = ids;
    return 0;
malformed:
    snprintf(err, errlen, "the snapshot is malformed (a section does not parse)");
    return -1;
}

int snap_check(const fwd_ctx *f, const void *data, size_t len, const snap_identity *want, snap_info *info, char *err,
               size_t errlen)
{
    return parse((fwd_ctx *)f, NULL, data, len, want, info, 0, NULL, err, errlen);
}

int snap_restore(fwd_ctx *f, samp *s, const void *data, size_t len, const snap_identity *want, int32_t **tokens,
                 int64_t *n_tokens, char *err, size_t errlen)
{
    snap_info in;
    if (parse(f, s, data, len, want, &in, 1, tokens, err, errlen)) return -1;
    *n_tokens = in.n_tokens;
    return 0;
}
