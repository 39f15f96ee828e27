/* snapshot.h - a sequence's whole state as bytes, so a saved session resumes without prefilling
 * again and continues exactly as it would have.
 *
 * Layout (docs/store.md has the field list): an 8-byte magic, format version, byte-order mark,
 * payload length; the payload (model identity, the token ids, the paged KV cache, the policies'
 * spec and state, the sampler's RNG and history); a sha256 over everything before it. snap_check
 * verifies magic, version, length, checksum, model identity and every section's structure without
 * touching any engine state; snap_restore runs it and only then replaces the cache, the policy
 * state and the sampler state. */
#ifndef KVCHAT_SNAPSHOT_H
#define KVCHAT_SNAPSHOT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/forward.h"
#include "engine/sampler.h"

#define SNAP_VERSION 1

/* What a snapshot must match: the model file's content and the cache's shape. */
typedef struct snap_identity {
    char model_sha256[65];
    int32_t n_layer, n_head_kv, head_dim, n_vocab, page_size;
} snap_identity;

typedef struct snap_info {
    uint32_t version;
    snap_identity id;
    int64_t n_tokens;        /* token ids of the sequence (the cache holds the first kv_len) */
    int64_t kv_len;
    char policy[256];        /* the policy spec the state was taken under */
} snap_info;

/* The identity of model file path as loaded in f (sha256 of the whole file). 0, or -1 with a message. */
int snap_identity_of(const fwd_ctx *f, const char *model_sha256, snap_identity *id);
/* sha256 of a file as 64 hex digits. 0, or -1 with a message. */
int snap_sha256_file(const char *path, char out[65], char *err, size_t errlen);
void snap_sha256_bytes(const void *p, size_t n, char out[65]);

/* The KV page size a snapshot was taken with (a resumed session opens its cache with it), or -1
 * when the bytes are too short to say. Nothing else is checked. */
int snap_page_size(const void *data, size_t len);

/* A byte range of snapshot bytes. */
typedef struct snap_range {
    size_t off, len;
} snap_range;
/* The ranges that hold the cache's pages (each page's token count, positions, log-degrees, keys
 * and values), in order: what consecutive snapshots of one conversation mostly share, so the store
 * keeps each page once. *out malloc'd. 0, or -1 when the bytes do not parse (nothing is checked
 * beyond the structure: snap_check does that). */
int snap_page_ranges(const void *data, size_t len, snap_range **out, int64_t *n);

/* Serialize. tokens: the sequence's ids (at least kv_len of them; more when the last sampled tokens
 * were not evaluated yet). *out is malloc'd. 0, or -1 with a message. */
int snap_save(const fwd_ctx *f, const samp *s, const snap_identity *id, const int32_t *tokens, int64_t n_tokens,
              void **out, size_t *len, char *err, size_t errlen);
/* Verify everything (want may be NULL: identity not checked). 0, or -1 with a message naming the
 * problem (corrupt, truncated, another model, another format version). */
int snap_check(const fwd_ctx *f, const void *data, size_t len, const snap_identity *want, snap_info *info, char *err,
               size_t errlen);
/* snap_check, then replace f's cache and policy state and s's sampler state; *tokens (malloc'd)
 * gets the sequence's ids. On failure nothing has changed. */
int snap_restore(fwd_ctx *f, samp *s, const void *data, size_t len, const snap_identity *want, int32_t **tokens,
                 int64_t *n_tokens, char *err, size_t errlen);

#endif
